//===- PlanSeal.cpp - the checksum trailer of a .mplan file ---------------===//
//
// A FlatBuffers buffer has slack (padding, unused vtable fields) the Verifier
// cannot see, and a flipped byte in a name or a scalar verifies fine: only a
// checksum over every byte turns "silently different run" into an error.
// CRC-32 detects every single-bit flip and every burst up to 32 bits.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/plan_generated.h"

#include <zlib.h>

#include <cstdio>
#include <cstring>

using namespace mapp::rt;
namespace fb = mapp::plan;

const uint32_t mapp::rt::kPlanSchemaVersion =
    static_cast<uint32_t>(fb::SchemaVersion::Current);

static_assert(sizeof(fb::PlanSeal) == kPlanSealBytes, "plan.fbs PlanSeal");
static constexpr uint32_t kMagic = static_cast<uint32_t>(fb::SealMagic::MPSL);
/// Bytes of the seal covered by the checksum: magic, version, body_bytes.
static constexpr size_t kCovered = 16;

uint32_t mapp::rt::sealCrc32(const uint8_t *data, size_t size, uint32_t crc) {
  uLong c = crc;
  // zlib takes uInt lengths: feed large inputs in pieces.
  for (size_t off = 0; off < size;) {
    size_t n = std::min<size_t>(size - off, 1u << 30);
    c = crc32(c, data + off, static_cast<uInt>(n));
    off += n;
  }
  return static_cast<uint32_t>(c);
}

static uint32_t sealChecksum(const uint8_t *body, size_t size,
                             const uint8_t *sealHead) {
  return sealCrc32(sealHead, kCovered, sealCrc32(body, size));
}

std::vector<uint8_t> mapp::rt::sealPlan(const uint8_t *body, size_t size) {
  std::vector<uint8_t> out(body, body + size);
  fb::PlanSeal seal(kMagic, kPlanSchemaVersion, size, 0, 0);
  uint8_t raw[kPlanSealBytes];
  std::memcpy(raw, &seal, sizeof raw);
  fb::PlanSeal withSum(kMagic, kPlanSchemaVersion, size,
                       sealChecksum(body, size, raw), 0);
  std::memcpy(raw, &withSum, sizeof raw);
  out.insert(out.end(), raw, raw + sizeof raw);
  return out;
}

static std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

size_t mapp::rt::checkPlanSeal(const uint8_t *data, size_t size,
                               uint32_t &checksum) {
  bool hasId = size >= 8 && std::memcmp(data + 4, fb::PlanIdentifier(), 4) == 0;
  if (size < kPlanSealBytes + 8) {
    if (!hasId)
      fail("plan: file too small (", size, " bytes) to be a mapp plan");
    fail("plan: corrupt plan: file too small (", size, " bytes)");
  }
  fb::PlanSeal seal;
  std::memcpy(&seal, data + size - kPlanSealBytes, kPlanSealBytes);
  if (seal.magic() != kMagic) {
    if (!hasId)
      fail("plan: not a mapp plan (no \"MPLN\" identifier, no seal)");
    fail("plan: corrupt plan: no checksum seal at the end of the file "
         "(truncated, appended to, or written by a compiler older than plan "
         "schema version 2)");
  }
  size_t body = size - kPlanSealBytes;
  if (seal.body_bytes() != body)
    fail("plan: corrupt plan: the seal records a ", seal.body_bytes(),
         "-byte body but the file holds ", body,
         " bytes before it (truncated or appended to)");
  if (seal.reserved() != 0)
    fail("plan: corrupt plan: seal field 'reserved' is ", seal.reserved(),
         " (must be 0)");
  uint32_t computed =
      sealChecksum(data, body, data + size - kPlanSealBytes);
  if (computed != seal.checksum())
    fail("plan: corrupt plan: checksum mismatch (seal ", hex(seal.checksum()),
         ", contents ", hex(computed),
         "): the file changed after the compiler wrote it");
  if (seal.version() != kPlanSchemaVersion)
    fail("plan: schema version ", seal.version(), " but this runtime reads ",
         kPlanSchemaVersion, "; rebuild the plan with a matching compiler");
  checksum = computed;
  return body;
}
