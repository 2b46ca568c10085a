//===- AllToAllv.cpp - variable all-to-all, the communicator-neutral part -===//
//
// Expert parallelism sends each peer as many token rows as were routed to
// its experts, so the blocks of an all_to_all differ per pair and per step.
// Two things every communicator shares live here:
//
// - agreeCounts: every member's full row of (send, recv) counts goes to
//   every member (one fixed-size allToAll), so each member checks the whole
//   count matrix and a disagreement fails on all of them with one message,
//   before any payload moves. Checking only one's own column would let the
//   members outside the bad pair go on into the payload exchange and wait
//   out the timeout instead.
// - the default payload exchange: pad every block to the largest one and
//   run the fixed-size allToAll (correct for any communicator; the thread
//   world and MPI override allToAllv with exact-size transfers).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cstring>

using namespace mapp::rt;

namespace {

void checkSizes(const std::vector<uint64_t> &sendBytes,
                const std::vector<uint64_t> &recvBytes, const CommGroup &g,
                int rank) {
  if (g.indexOf(rank) < 0)
    fail("all_to_allv over ", g.str(), ": rank ", rank, " is not a member");
  if (sendBytes.size() != static_cast<size_t>(g.size()) ||
      recvBytes.size() != static_cast<size_t>(g.size()))
    fail("all_to_allv over ", g.str(), " (rank ", rank, "): ",
         sendBytes.size(), " send and ", recvBytes.size(),
         " receive counts for a group of ", g.size(),
         " (one count per member each)");
}

} // namespace

std::vector<uint64_t>
Communicator::agreeCounts(const std::vector<uint64_t> &sendBytes,
                          const std::vector<uint64_t> &recvBytes,
                          const CommGroup &g) {
  checkSizes(sendBytes, recvBytes, g, rank());
  size_t n = static_cast<size_t>(g.size());
  std::vector<uint64_t> row(2 * n);
  std::copy(sendBytes.begin(), sendBytes.end(), row.begin());
  std::copy(recvBytes.begin(), recvBytes.end(), row.begin() + n);
  std::vector<uint64_t> rows(n * 2 * n);
  if (n == 1) {
    rows = row;
  } else {
    std::vector<uint64_t> mine(n * 2 * n);
    for (size_t j = 0; j < n; ++j)
      std::copy(row.begin(), row.end(), mine.begin() + j * 2 * n);
    allToAll(mine.data(), rows.data(), 2 * n * sizeof(uint64_t), g);
  }
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      uint64_t sends = rows[i * 2 * n + j], expects = rows[j * 2 * n + n + i];
      if (sends != expects)
        fail("all_to_allv over ", g.str(), ": rank ", g.members[i], " sends ",
             sends, " bytes to rank ", g.members[j], ", which expects ",
             expects, " from it (the members' counts disagree: mismatched "
             "plan or receive counts)");
    }
  return rows;
}

std::vector<uint64_t>
Communicator::exchangeCounts(const std::vector<uint64_t> &sendBytes,
                             const CommGroup &g) {
  if (g.indexOf(rank()) < 0)
    fail("all_to_allv counts over ", g.str(), ": rank ", rank(),
         " is not a member");
  if (sendBytes.size() != static_cast<size_t>(g.size()))
    fail("all_to_allv counts over ", g.str(), " (rank ", rank(), "): ",
         sendBytes.size(), " send counts for a group of ", g.size());
  std::vector<uint64_t> recv(sendBytes.size());
  if (g.size() == 1)
    return sendBytes;
  allToAll(sendBytes.data(), recv.data(), sizeof(uint64_t), g);
  return recv;
}

void Communicator::allToAllv(const void *in,
                             const std::vector<uint64_t> &sendBytes,
                             void *out,
                             const std::vector<uint64_t> &recvBytes,
                             const CommGroup &g) {
  std::vector<uint64_t> rows = agreeCounts(sendBytes, recvBytes, g);
  size_t n = static_cast<size_t>(g.size());
  if (n == 1) {
    if (in != out && sendBytes[0])
      std::memmove(out, in, sendBytes[0]);
    return;
  }
  uint64_t widest = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      widest = std::max(widest, rows[i * 2 * n + j]);
  if (widest == 0)
    return;
  std::vector<uint8_t> packed(n * widest), got(n * widest);
  const uint8_t *src = static_cast<const uint8_t *>(in);
  for (size_t j = 0; j < n; ++j) {
    if (sendBytes[j])
      std::memcpy(packed.data() + j * widest, src, sendBytes[j]);
    src += sendBytes[j];
  }
  allToAll(packed.data(), got.data(), widest, g);
  uint8_t *dst = static_cast<uint8_t *>(out);
  for (size_t i = 0; i < n; ++i) {
    if (recvBytes[i])
      std::memcpy(dst, got.data() + i * widest, recvBytes[i]);
    dst += recvBytes[i];
  }
}
