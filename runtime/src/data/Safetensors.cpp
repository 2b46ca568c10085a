//===- Safetensors.cpp ----------------------------------------------------===//
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <set>
#include <algorithm>
#include <cmath>

using namespace mapp::rt;
using json = nlohmann::json;

const char *mapp::rt::safetensorsDTypeName(DType t) {
  switch (t) {
  case DType::F32:
    return "F32";
  case DType::BF16:
    return "BF16";
  case DType::F16:
    return "F16";
  case DType::I32:
    return "I32";
  case DType::I64:
    return "I64";
  }
  return "?";
}

bool mapp::rt::parseSafetensorsDType(const std::string &s, DType &out) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64})
    if (s == safetensorsDTypeName(t)) {
      out = t;
      return true;
    }
  return false;
}

StTensor StTensor::fromF32(const Shape &shape, const float *values) {
  StTensor t;
  t.dtype = DType::F32;
  t.shape = shape;
  t.data.resize(numel(shape) * 4);
  if (!t.data.empty())
    std::memcpy(t.data.data(), values, t.data.size());
  return t;
}

StTensor StTensor::fromI32(const Shape &shape, const int32_t *values) {
  StTensor t;
  t.dtype = DType::I32;
  t.shape = shape;
  t.data.resize(numel(shape) * 4);
  if (!t.data.empty())
    std::memcpy(t.data.data(), values, t.data.size());
  return t;
}

template <typename T> static T load(const uint8_t *p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::vector<float> StTensor::toF32(const std::string &what) const {
  int64_t n = numel(shape);
  std::vector<float> out(n);
  const uint8_t *p = data.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
    case DType::F32:
      out[i] = load<float>(p + 4 * i);
      break;
    case DType::BF16:
      out[i] = bf16ToFloat(load<uint16_t>(p + 2 * i));
      break;
    case DType::F16:
      out[i] = f16ToFloat(load<uint16_t>(p + 2 * i));
      break;
    case DType::I32:
      out[i] = static_cast<float>(load<int32_t>(p + 4 * i));
      break;
    case DType::I64:
      out[i] = static_cast<float>(load<int64_t>(p + 8 * i));
      break;
    }
  }
  (void)what;
  return out;
}

std::vector<int32_t> StTensor::toI32(const std::string &what) const {
  int64_t n = numel(shape);
  std::vector<int32_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::I32)
      out[i] = load<int32_t>(data.data() + 4 * i);
    else if (dtype == DType::I64)
      out[i] = static_cast<int32_t>(load<int64_t>(data.data() + 8 * i));
    else
      fail("tensor '", what, "' is ", safetensorsDTypeName(dtype),
           ", expected an integer type");
  }
  return out;
}

Safetensors mapp::rt::parseSafetensors(const std::vector<uint8_t> &bytes,
                                       const std::string &where) {
  if (bytes.size() < 8)
    fail(where, ": not a safetensors file (", bytes.size(), " bytes)");
  uint64_t n = load<uint64_t>(bytes.data());
  if (n > bytes.size() - 8)
    fail(where, ": header length ", n, " exceeds the file size ", bytes.size());
  json header;
  // nlohmann keeps the last of duplicate keys: watch the top level's keys,
  // since a second "x" would silently replace the first tensor.
  std::set<std::string> keys;
  std::string duplicate;
  auto watchKeys = [&](int depth, json::parse_event_t ev, json &parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        parsed.is_string() && !keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + n, watchKeys);
  } catch (const std::exception &e) {
    fail(where, ": header is not valid JSON (", e.what(), ")");
  }
  if (!duplicate.empty())
    fail(where, ": tensor '", duplicate, "' appears twice in the header");
  if (!header.is_object())
    fail(where, ": header is not a JSON object");
  const uint8_t *dataStart = bytes.data() + 8 + n;
  uint64_t dataSize = bytes.size() - 8 - n;
  Safetensors st;
  struct Range {
    uint64_t b, e;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string &name = it.key();
    const json &e = it.value();
    if (name == "__metadata__") {
      if (e.is_object())
        for (auto m = e.begin(); m != e.end(); ++m)
          if (m.value().is_string())
            st.metadata[m.key()] = m.value().get<std::string>();
      continue;
    }
    std::string at = where + ": tensor '" + name + "'";
    try {
      StTensor t;
      std::string dt = e.at("dtype").get<std::string>();
      if (!parseSafetensorsDType(dt, t.dtype))
        fail(at, ": unsupported dtype ", dt,
             " (supported: F32, BF16, F16, I32, I64)");
      uint64_t count = 1;
      // nlohmann casts a float to the integer asked for: out of range that
      // is undefined behaviour, in range a silent truncation (both found by
      // mapp-fuzz-safetensors under UBSan).
      for (const json &d : e.at("shape")) {
        if (!d.is_number_integer())
          fail(at, ": shape ", e.at("shape").dump(), " must hold integers");
        int64_t v = d.get<int64_t>();
        if (v < 0 || (v > 0 && count > (uint64_t(1) << 48) / v))
          fail(at, ": bad shape");
        t.shape.push_back(v);
        count *= v;
      }
      const json &off = e.at("data_offsets");
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned())
        fail(at, ": data_offsets must be [begin, end] of byte offsets, got ",
             off.dump());
      uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (b > en || en > dataSize)
        fail(at, ": data_offsets [", b, ", ", en,
             "] outside the data region of ", dataSize, " bytes");
      if (en - b != count * dtypeSize(t.dtype))
        fail(at, ": ", en - b, " bytes for ", dt, shapeStr(t.shape));
      t.data.assign(dataStart + b, dataStart + en);
      if (en > b)
        ranges.push_back({b, en, name});
      st.tensors[name] = std::move(t);
    } catch (const json::exception &ex) {
      fail(at, ": malformed entry (", ex.what(), ")");
    }
  }
  // Tensors own disjoint bytes (the format's rule): an overlap means two
  // names share, or a writer bug.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range &x, const Range &y) { return x.b < y.b; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].b < ranges[i - 1].e)
      fail(where, ": tensors '", ranges[i - 1].name, "' [", ranges[i - 1].b,
           ", ", ranges[i - 1].e, ") and '", ranges[i].name, "' [",
           ranges[i].b, ", ", ranges[i].e, ") overlap in the data region");
  return st;
}

void mapp::rt::checkFinite(const Safetensors &st, const std::string &where) {
  for (const auto &[name, t] : st.tensors) {
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 &&
        t.dtype != DType::F16)
      continue;
    std::vector<float> v = t.toF32(name);
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        fail(where, ": tensor '", name, "' element ", i, " is ",
             std::isnan(v[i]) ? "NaN" : v[i] > 0 ? "+inf" : "-inf",
             " (--allow-nonfinite-weights loads it anyway)");
  }
}

Safetensors mapp::rt::readSafetensors(const std::string &path) {
  std::vector<uint8_t> bytes;
  std::string why;
  if (!readRegularFile(path, bytes, why))
    fail("cannot open safetensors file '", path, "' (", why, ")");
  return parseSafetensors(bytes, path);
}

std::vector<uint8_t> mapp::rt::serializeSafetensors(const Safetensors &st) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto &[name, t] : st.tensors) {
    header[name] = {{"dtype", safetensorsDTypeName(t.dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  if (!st.metadata.empty())
    header["__metadata__"] = st.metadata;
  std::string h = header.dump();
  // Pad with spaces so the data region starts 8-byte aligned.
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t n = h.size();
  std::vector<uint8_t> out(8 + n + offset);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), n);
  uint8_t *dst = out.data() + 8 + n;
  for (const auto &kv : st.tensors) {
    if (!kv.second.data.empty())
      std::memcpy(dst, kv.second.data.data(), kv.second.data.size());
    dst += kv.second.data.size();
  }
  return out;
}

void mapp::rt::writeSafetensors(const std::string &path,
                                const Safetensors &st) {
  // Atomic: a kill mid-save leaves the previous file whole (issue 17).
  std::vector<uint8_t> bytes = serializeSafetensors(st);
  writeFileAtomic(path, bytes.data(), bytes.size());
}
