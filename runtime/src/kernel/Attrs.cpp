//===- Attrs.cpp ----------------------------------------------------------===//
#include "mapp/rt/Attrs.h"
#include "mapp/rt/Error.h"

using namespace mapp::rt;

static const char *kindName(AttrValue::Kind k) {
  switch (k) {
  case AttrValue::Int:
    return "int";
  case AttrValue::Float:
    return "float";
  case AttrValue::Str:
    return "string";
  case AttrValue::Ints:
    return "int list";
  case AttrValue::Floats:
    return "float list";
  }
  return "?";
}

void Attrs::setInt(const std::string &key, int64_t v) {
  AttrValue a;
  a.kind = AttrValue::Int;
  a.i = v;
  set(key, a);
}
void Attrs::setFloat(const std::string &key, double v) {
  AttrValue a;
  a.kind = AttrValue::Float;
  a.f = v;
  set(key, a);
}
void Attrs::setStr(const std::string &key, std::string v) {
  AttrValue a;
  a.kind = AttrValue::Str;
  a.s = std::move(v);
  set(key, a);
}
void Attrs::setInts(const std::string &key, std::vector<int64_t> v) {
  AttrValue a;
  a.kind = AttrValue::Ints;
  a.ints = std::move(v);
  set(key, a);
}

const AttrValue *Attrs::find(const std::string &key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

int64_t Attrs::getInt(const std::string &key, int64_t def) const {
  const AttrValue *a = find(key);
  if (!a)
    return def;
  if (a->kind != AttrValue::Int)
    fail("attribute '", key, "' must be an int, got ", kindName(a->kind));
  return a->i;
}

int64_t Attrs::requireInt(const std::string &key) const {
  if (!has(key))
    fail("missing int attribute '", key, "'");
  return getInt(key, 0);
}

double Attrs::getFloat(const std::string &key, double def) const {
  const AttrValue *a = find(key);
  if (!a)
    return def;
  if (a->kind == AttrValue::Int)
    return static_cast<double>(a->i);
  if (a->kind != AttrValue::Float)
    fail("attribute '", key, "' must be a float, got ", kindName(a->kind));
  return a->f;
}

double Attrs::requireFloat(const std::string &key) const {
  if (!has(key))
    fail("missing float attribute '", key, "'");
  return getFloat(key, 0);
}

std::string Attrs::getStr(const std::string &key,
                          const std::string &def) const {
  const AttrValue *a = find(key);
  if (!a)
    return def;
  if (a->kind != AttrValue::Str)
    fail("attribute '", key, "' must be a string, got ", kindName(a->kind));
  return a->s;
}

std::vector<int64_t> Attrs::getInts(const std::string &key) const {
  const AttrValue *a = find(key);
  if (!a)
    return {};
  if (a->kind != AttrValue::Ints)
    fail("attribute '", key, "' must be an int list, got ", kindName(a->kind));
  return a->ints;
}

bool Attrs::flag(const std::string &key) const {
  const AttrValue *a = find(key);
  if (!a)
    return false;
  return a->kind != AttrValue::Int || a->i != 0;
}
