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
