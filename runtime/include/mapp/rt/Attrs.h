//===- Attrs.h - instruction attributes -------------------------*- C++ -*-===//
//
// Decoded once at load time from the plan's Attr tables so that kernels look
// attributes up by name without touching FlatBuffers.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_ATTRS_H
#define MAPP_RT_ATTRS_H

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mapp::rt {

struct AttrValue {
  enum Kind { Int, Float, Str, Ints, Floats } kind = Int;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
};

class Attrs {
public:
  void set(const std::string &key, AttrValue v) { map_[key] = std::move(v); }
  void setInt(const std::string &key, int64_t v);
  void setFloat(const std::string &key, double v);
  void setStr(const std::string &key, std::string v);
  void setInts(const std::string &key, std::vector<int64_t> v);

  bool has(const std::string &key) const { return map_.count(key) != 0; }
  /// Integer attribute; an absent key yields `def`. Wrong kind is an Error.
  int64_t getInt(const std::string &key, int64_t def) const;
  int64_t requireInt(const std::string &key) const;
  /// Float attribute; Int payloads are accepted (a writer may emit `0`).
  double getFloat(const std::string &key, double def) const;
  double requireFloat(const std::string &key) const;
  std::string getStr(const std::string &key, const std::string &def) const;
  std::vector<int64_t> getInts(const std::string &key) const;
  /// Unit attribute: present (as Int != 0, or any non-Int payload) = true.
  bool flag(const std::string &key) const;

  const std::map<std::string, AttrValue> &all() const { return map_; }

private:
  const AttrValue *find(const std::string &key) const;
  std::map<std::string, AttrValue> map_;
};

} // namespace mapp::rt

#endif
