//===- SafetensorsTest.cpp ------------------------------------------------===//
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace mapp::rt;

TEST(Safetensors, RoundTripAllDTypes) {
  Safetensors st;
  std::vector<float> f = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  st.tensors["a.weight"] = StTensor::fromF32({2, 3}, f.data());
  std::vector<int32_t> i = {1, -2, 3};
  st.tensors["ids"] = StTensor::fromI32({3}, i.data());
  StTensor bf;
  bf.dtype = DType::BF16;
  bf.shape = {2};
  uint16_t bfv[2] = {floatToBf16(1.5f), floatToBf16(-0.375f)};
  bf.data.assign(reinterpret_cast<uint8_t *>(bfv),
                 reinterpret_cast<uint8_t *>(bfv) + 4);
  st.tensors["bf"] = bf;
  StTensor h = bf;
  h.dtype = DType::F16;
  uint16_t hv[2] = {floatToF16(0.1f), floatToF16(-65504.0f)};
  std::memcpy(h.data.data(), hv, 4);
  st.tensors["h"] = h;
  StTensor l;
  l.dtype = DType::I64;
  l.shape = {1};
  int64_t lv = -5;
  l.data.assign(reinterpret_cast<uint8_t *>(&lv),
                reinterpret_cast<uint8_t *>(&lv) + 8);
  st.tensors["l"] = l;
  st.tensors["empty"] = StTensor::fromF32({0, 4}, nullptr);
  st.metadata["format"] = "pt";

  std::vector<uint8_t> bytes = serializeSafetensors(st);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data region must be 8-byte aligned";

  Safetensors back = parseSafetensors(bytes, "mem");
  ASSERT_EQ(back.tensors.size(), st.tensors.size());
  EXPECT_EQ(back.metadata.at("format"), "pt");
  EXPECT_EQ(back.tensors.at("a.weight").toF32("a"), f);
  EXPECT_EQ(back.tensors.at("a.weight").shape, (Shape{2, 3}));
  EXPECT_EQ(back.tensors.at("ids").toI32("ids"), i);
  EXPECT_EQ(back.tensors.at("bf").toF32("bf"),
            (std::vector<float>{1.5f, -0.375f}));
  std::vector<float> hf = back.tensors.at("h").toF32("h");
  EXPECT_NEAR(hf[0], 0.1f, 1e-4);
  EXPECT_EQ(hf[1], -65504.0f);
  EXPECT_EQ(back.tensors.at("l").toI32("l"), (std::vector<int32_t>{-5}));
  EXPECT_EQ(back.tensors.at("empty").shape, (Shape{0, 4}));
}

TEST(Safetensors, HalfConversions) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToF16(1.0f), 0x3C00);
  EXPECT_EQ(floatToF16(-2.0f), 0xC000);
  EXPECT_EQ(f16ToFloat(0x0001), std::ldexp(1.0f, -24));
  for (float v : {0.5f, -3.75f, 1024.0f, 6.1035156e-05f})
    EXPECT_EQ(f16ToFloat(floatToF16(v)), v);
}

static std::vector<uint8_t> withHeader(const std::string &json,
                                       size_t dataBytes) {
  uint64_t n = json.size();
  std::vector<uint8_t> b(8 + n + dataBytes, 0);
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, json.data(), n);
  return b;
}

TEST(Safetensors, CorruptFilesAreErrors) {
  auto expectError = [](const std::vector<uint8_t> &b, const char *needle) {
    try {
      parseSafetensors(b, "f");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << e.what();
    }
  };
  expectError({1, 2, 3}, "not a safetensors");
  expectError(withHeader("{", 0), "not valid JSON");
  expectError(
      withHeader(R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                 8),
      "unsupported dtype F64");
  expectError(
      withHeader(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                 4),
      "4 bytes for F32[2]");
  expectError(
      withHeader(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                 2),
      "outside the data region");
  expectError(withHeader(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
              "tensor 't': malformed");
  std::vector<uint8_t> big = withHeader("{}", 0);
  uint64_t huge = 1ull << 40;
  std::memcpy(big.data(), &huge, 8);
  expectError(big, "exceeds the file size");
}

// Issue 17: both were accepted without a word (the second "t" replaced the
// first; two names read the same bytes).
TEST(Safetensors, DuplicateKeysAndOverlappingRangesAreErrors) {
  auto errorOf = [](const std::vector<uint8_t> &b) -> std::string {
    try {
      parseSafetensors(b, "f");
    } catch (const Error &e) {
      return e.what();
    }
    return "<no error>";
  };
  std::string dup = errorOf(withHeader(
      R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8));
  EXPECT_NE(dup.find("f: tensor 't' appears twice in the header"),
            std::string::npos)
      << dup;
  std::string overlap = errorOf(withHeader(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12));
  EXPECT_NE(overlap.find("f: tensors 'a' [0, 8) and 'b' [4, 12) overlap"),
            std::string::npos)
      << overlap;
  // Adjacent ranges, empty tensors and a duplicate key inside __metadata__'s
  // own object (not a tensor name) are fine.
  EXPECT_EQ(errorOf(withHeader(
                R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                8)),
            "<no error>");
}

TEST(Safetensors, CheckFiniteNamesTheTensor) {
  Safetensors st;
  float good[3] = {1, -2, 3};
  st.tensors["ok"] = StTensor::fromF32({3}, good);
  EXPECT_NO_THROW(checkFinite(st, "w.st"));
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    float v[3] = {0, bad, 0};
    Safetensors b = st;
    b.tensors["layer.weight"] = StTensor::fromF32({3}, v);
    try {
      checkFinite(b, "w.st");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error &e) {
      EXPECT_NE(std::string(e.what()).find("w.st: tensor 'layer.weight' element 1 is "),
                std::string::npos)
          << e.what();
    }
  }
  // Integer tensors have no NaN.
  int32_t ids[2] = {1, 2};
  st.tensors["ids"] = StTensor::fromI32({2}, ids);
  EXPECT_NO_THROW(checkFinite(st, "w.st"));
}
