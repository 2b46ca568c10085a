//===- PlanLoaderTest.cpp - verification of plan artifacts ----------------===//
//
// A valid hand-built plan loads; every way of breaking it (semantic edits,
// truncation at every length, random byte flips, wrong identifier/version)
// yields an Error with a message, never a crash.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

/// Parses through an 8-byte aligned copy, as loadPlan does.
Plan parse(const std::vector<uint8_t> &bytes) {
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8 + 1);
  if (!bytes.empty())
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()),
                   bytes.size());
}

std::string errorOf(const PlanSpec &s) {
  try {
    parse(s.build());
  } catch (const Error &e) {
    return e.what();
  }
  return "<no error>";
}

MlpOptions small() {
  MlpOptions o;
  o.vocab = 16;
  o.hidden = 4;
  o.ffn = 6;
  o.batch = 2;
  o.seq = 3;
  return o;
}

} // namespace

TEST(PlanLoader, LoadsAValidPlan) {
  Plan p = parse(mlpPlan(small()).build());
  ASSERT_EQ(p.programs.size(), 1u);
  EXPECT_EQ(p.version, kPlanSchemaVersion);
  EXPECT_EQ(p.programs[0].blocks.size(), 3u);
  EXPECT_EQ(p.programs[0].blocks[0].instrs[0].kernel, "embedding");
  EXPECT_EQ(p.programs[0].blocks[0].instrs[2].attrs.getStr("approximate", ""),
            "tanh");
}

TEST(PlanLoader, SemanticErrorsNameTheProblem) {
  struct Case {
    const char *expect;
    std::function<void(PlanSpec &)> edit;
  };
  std::vector<Case> cases = {
      {"plan: instr 1 (linear) in block 0: input 99 out of range (program has",
       [](PlanSpec &s) { s.blocks[0].instrs[1].in[1] = 99; }},
      {"output -1 out of range",
       [](PlanSpec &s) { s.blocks[0].instrs[0].out[0] = -1; }},
      {"unknown kernel 'frobnicate'",
       [](PlanSpec &s) { s.blocks[0].instrs[2].kernel = "frobnicate"; }},
      {"(gelu) in block 0: takes 1 inputs, got 2",
       [](PlanSpec &s) { s.blocks[0].instrs[2].in.push_back(0); }},
      {"w must be [N,K]",
       [](PlanSpec &s) {
         std::swap(s.blocks[0].instrs[1].in[1], s.blocks[0].instrs[3].in[1]);
       }},
      {"bytes = 3 but f32[2,3] needs 24",
       [](PlanSpec &s) {
         s.values[0].bytes = 3;
         s.values[0].dtype = DType::F32;
       }},
      {"exceeds arena_bytes",
       [](PlanSpec &s) { s.values[0].offset = 1 << 30; }},
      {"task 0: block 7 out of range",
       [](PlanSpec &s) { s.tasks[0].first = 7; }},
      {"microbatch 3 out of range", [](PlanSpec &s) { s.tasks[0].second = 3; }},
      {"tokens value 12 ('x') must be Input i32[2,3], is Temp f32[2,3,4]",
       [](PlanSpec &s) { s.tokens = 12; }},
      {"schema version 99", [](PlanSpec &s) { s.version = 99; }},
      {"must be Grad",
       [](PlanSpec &s) {
         s.blocks[1].instrs[14].out[0] = s.blocks[1].instrs[14].in[0];
       }},
      {"missing float attribute 'lr'",
       [](PlanSpec &s) { s.blocks[2].instrs[0].attrs = Attrs(); }},
      {"attribute 'dims' must be an int list",
       [](PlanSpec &s) { s.blocks[1].instrs[5].attrs.setFloat("dims", 1); }},
      {"micro_batch_size, seq_length and vocab_size must be >= 1",
       [](PlanSpec &s) { s.vocabSize = 0; }},
  };
  for (const Case &c : cases) {
    PlanSpec s = mlpPlan(small());
    c.edit(s);
    std::string err = errorOf(s);
    EXPECT_NE(err.find(c.expect), std::string::npos)
        << "expected '" << c.expect << "', got '" << err << "'";
  }
}

TEST(PlanLoader, WrongIdentifierAndTinyFiles) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  b[4] = 'X';
  EXPECT_THROW(parse(b), Error);
  EXPECT_THROW(parse({}), Error);
  EXPECT_THROW(parse({1, 2, 3}), Error);
}

TEST(PlanLoader, EveryTruncationIsAnError) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> t(b.begin(), b.begin() + n);
    EXPECT_THROW(parse(t), Error) << "truncated at " << n;
  }
}

TEST(PlanLoader, RandomByteFlipsAreAllRejected) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  std::mt19937 rng(1234);
  int loaded = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<uint8_t> t = b;
    int flips = 1 + iter % 4;
    for (int k = 0; k < flips; ++k)
      t[rng() % t.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (t == b)
      continue; // two flips of one byte cancelled
    try {
      parse(t);
      ++loaded;
    } catch (const Error &) {
    }
  }
  EXPECT_EQ(loaded, 0); // CRC-32 misses 1 in 2^32 random changes
}

// Issue 17: before the seal, half of all single bit flips loaded (one renamed
// a parameter, so training silently differed), and so did a file one byte
// short or 1000 bytes long. Every byte offset, one bit each (the bit index
// cycles so each of the 8 positions is hit), must now be a "corrupt plan".
std::string parseError(const std::vector<uint8_t> &t) {
  try {
    parse(t);
  } catch (const Error &e) {
    return e.what();
  }
  return "<loaded>";
}

TEST(PlanLoader, EveryBitFlipOffsetIsACorruptPlan) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  ASSERT_NO_THROW(parse(b));
  ASSERT_GT(b.size(), kPlanSealBytes);
  int rejected = 0;
  for (size_t i = 0; i < b.size(); ++i)
    for (int bit : {int(i % 8), int((i + 3) % 8)}) {
      std::vector<uint8_t> t = b;
      t[i] ^= static_cast<uint8_t>(1u << bit);
      std::string err = parseError(t);
      EXPECT_NE(err.find("corrupt plan"), std::string::npos)
          << "bit " << bit << " of byte " << i << ": " << err;
      rejected += err != "<loaded>";
    }
  EXPECT_EQ(rejected, int(2 * b.size()));
}

TEST(PlanLoader, TruncatedOrExtendedIsACorruptPlan) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  std::vector<uint8_t> shorter(b.begin(), b.end() - 1);
  EXPECT_NE(parseError(shorter).find("corrupt plan: no checksum seal"),
            std::string::npos)
      << parseError(shorter);
  for (uint8_t fill : {uint8_t(0), uint8_t(0xff)}) {
    std::vector<uint8_t> longer = b;
    longer.insert(longer.end(), 1000, fill);
    EXPECT_NE(parseError(longer).find("corrupt plan: no checksum seal"),
              std::string::npos)
        << parseError(longer);
  }
  // The seal copied after 1000 more bytes still records the old length.
  std::vector<uint8_t> moved(b.begin(), b.end() - kPlanSealBytes);
  moved.insert(moved.end(), 1000, 0);
  moved.insert(moved.end(), b.end() - kPlanSealBytes, b.end());
  EXPECT_NE(parseError(moved).find("corrupt plan: the seal records a"),
            std::string::npos)
      << parseError(moved);
}

TEST(PlanLoader, SealCarriesTheChecksumAndVersion) {
  std::vector<uint8_t> b = mlpPlan(small()).build();
  Plan p = parse(b);
  uint32_t sum = 0;
  EXPECT_EQ(checkPlanSeal(b.data(), b.size(), sum), b.size() - kPlanSealBytes);
  EXPECT_EQ(p.checksum, sum);
  // Same plan, same checksum; another plan, another one.
  EXPECT_EQ(parse(mlpPlan(small()).build()).checksum, sum);
  MlpOptions o = small();
  o.hidden = 8;
  EXPECT_NE(parse(mlpPlan(o).build()).checksum, sum);
  // Sealing is deterministic: the body re-sealed is the same file.
  std::vector<uint8_t> body(b.begin(), b.end() - kPlanSealBytes);
  std::vector<uint8_t> resealed = sealPlan(body.data(), body.size());
  EXPECT_EQ(resealed, b);
}

// A reshape marked `alias` skips its copy, so the loader accepts it only
// when its output is exactly its input's storage.
TEST(PlanLoader, ReshapeAliasMustShareItsInputStorage) {
  PlanSpec s = mlpPlan(small());
  TInstr &r = s.blocks[1].instrs[2];
  ASSERT_EQ(r.kernel, "reshape");
  int x = r.in[0], y = r.out[0];
  int64_t xOffset = parse(s.build()).programs[0].values[x].offset;
  r.attrs.setInt("alias", 1);
  // build() gives every value its own storage.
  EXPECT_NE(errorOf(s).find("instr 2 (reshape) in block 1: alias output"),
            std::string::npos)
      << errorOf(s);
  s.values[y].offset = xOffset;
  EXPECT_EQ(errorOf(s), "<no error>");
  // A partial overlap is not a view either.
  s.values[y].offset = xOffset + 64;
  EXPECT_NE(errorOf(s).find("is not the storage of input"), std::string::npos)
      << errorOf(s);
  // Without `alias` the same storage is an output clobbering its input.
  s.values[y].offset = xOffset;
  r.attrs = Attrs();
  EXPECT_NE(errorOf(s).find("shares storage with input"), std::string::npos)
      << errorOf(s);
  // Only reshapes are views.
  PlanSpec g = mlpPlan(small());
  g.blocks[0].instrs[2].attrs.setInt("alias", 1);
  EXPECT_NE(errorOf(g).find("(gelu) in block 0: only a reshape may be an alias"),
            std::string::npos)
      << errorOf(g);
}

// storage_bf16 (plan.fbs): only an f32 Temp of rank >= 2, whose bytes are
// numel * 2; withF32Storage doubles the arena for backends that store fp32.
TEST(PlanLoader, Bf16StorageIsCheckedAndWidens) {
  PlanSpec s = mlpPlan(small());
  int act = -1, input = -1, param = -1;
  for (size_t i = 0; i < s.values.size(); ++i) {
    const TValue &v = s.values[i];
    if (act < 0 && v.kind == ValueKind::Temp && v.dtype == DType::F32 &&
        v.shape.size() >= 2)
      act = static_cast<int>(i);
    if (input < 0 && v.kind == ValueKind::Input)
      input = static_cast<int>(i);
    if (param < 0 && v.kind == ValueKind::Param)
      param = static_cast<int>(i);
  }
  ASSERT_GE(act, 0);
  ASSERT_GE(input, 0);
  ASSERT_GE(param, 0);
  s.values[act].storageBf16 = true;
  Plan p = parse(s.build());
  const Program &prog = p.programs[0];
  ASSERT_TRUE(prog.values[act].storedBf16);
  EXPECT_EQ(prog.values[act].bytes,
            static_cast<uint64_t>(prog.values[act].type.numel()) * 2);
  EXPECT_TRUE(hasBf16Storage(prog));

  Program wide = withF32Storage(prog);
  EXPECT_FALSE(hasBf16Storage(wide));
  EXPECT_EQ(wide.arenaBytes, 2 * prog.arenaBytes);
  EXPECT_EQ(wide.persistentBytes, prog.persistentBytes);
  for (size_t i = 0; i < prog.values.size(); ++i) {
    const Value &a = prog.values[i], &w = wide.values[i];
    EXPECT_EQ(w.offset, inArena(a.kind) ? 2 * a.offset : a.offset) << a.name;
    EXPECT_EQ(w.bytes, static_cast<uint64_t>(a.type.numel()) *
                           dtypeSize(a.type.dtype))
        << a.name;
    EXPECT_LE(w.offset + w.bytes, inArena(a.kind) ? wide.arenaBytes
                                                  : wide.persistentBytes);
  }

  // An fp32 size with the flag set, and the flag on values it does not fit.
  s.values[act].bytes = numel(s.values[act].shape) * 4;
  EXPECT_NE(errorOf(s).find("stored as bf16 needs"), std::string::npos)
      << errorOf(s);
  s.values[act].bytes = -1;
  for (int v : {input, param}) {
    PlanSpec t = mlpPlan(small());
    t.values[v].storageBf16 = true;
    EXPECT_NE(errorOf(t).find("storage_bf16 is only for an f32 Temp of rank "
                              ">= 2"),
              std::string::npos)
        << errorOf(t);
  }
}
