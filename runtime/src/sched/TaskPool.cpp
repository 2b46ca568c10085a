//===- TaskPool.cpp - the adaptive scheduler's task rules -----------------===//
//
// Deadlock freedom (with the receives of AdaptiveScheduler.cpp): the oldest
// unfinished microbatch m0 is admitted (or admissible: nothing older holds
// the reservation, the cap holds at least one microbatch), its slot is free,
// and its next task depends only on tasks of m0 and of older microbatches,
// which ran; its receive arrives because the sender's task is m0's too.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/TaskPool.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <limits>

using namespace mapp::rt;
using namespace mapp::rt::sched;

const char *mapp::rt::sched::policyName(int policy) {
  return policy == BFC ? "bfc" : "dfc";
}

TaskPool::TaskPool(const Plan &plan, const Program &p, uint64_t capBytes) {
  const ScheduleTable *tab[2] = {nullptr, nullptr};
  for (const ScheduleTable &t : p.scheduleTables) {
    if (t.name == "dfc")
      tab[DFC] = &t;
    else if (t.name == "bfc")
      tab[BFC] = &t;
  }
  if (!tab[DFC] || !tab[BFC])
    fail("adaptive scheduling of rank ", p.rank,
         " needs the plan's 'dfc' and 'bfc' schedule tables "
         "(Program.schedule_tables); this plan has ",
         p.scheduleTables.size(), " table(s)",
         plan.schedule == "adaptive" ? ""
                                     : " (compile with schedule=adaptive)");
  std::map<std::pair<int, int>, int> id;
  for (const Task &t : tab[DFC]->tasks) {
    if (t.block < 0 || t.block >= static_cast<int>(p.blocks.size()))
      fail("schedule table 'dfc' of rank ", p.rank, ": block ", t.block,
           " out of range");
    if (p.blocks[t.block].kind == BlockKind::Optimizer)
      continue;
    if (!id.emplace(std::make_pair(t.block, t.microbatch),
                    static_cast<int>(tasks_.size()))
             .second)
      fail("schedule table 'dfc' of rank ", p.rank, ": task (block ",
           t.block, ", microbatch ", t.microbatch, ") appears twice");
    PoolTask pt;
    pt.task = t;
    pt.rank[DFC] = static_cast<int>(tasks_.size());
    tasks_.push_back(pt);
  }
  size_t nb = 0;
  for (const Task &t : tab[BFC]->tasks) {
    if (t.block >= 0 && t.block < static_cast<int>(p.blocks.size()) &&
        p.blocks[t.block].kind == BlockKind::Optimizer)
      continue;
    auto it = id.find({t.block, t.microbatch});
    if (it == id.end())
      fail("schedule table 'bfc' of rank ", p.rank, ": task (block ",
           t.block, ", microbatch ", t.microbatch,
           ") is not in the 'dfc' table (the tables must hold the same "
           "tasks)");
    tasks_[it->second].rank[BFC] = static_cast<int>(nb++);
  }
  if (nb != tasks_.size())
    fail("schedule table 'bfc' of rank ", p.rank, " has ", nb,
         " tasks, 'dfc' has ", tasks_.size());

  // Per-microbatch and per-block order, chunks.
  std::map<int, int> perMb;
  std::set<int> fwdChunks, bwdChunks;
  for (PoolTask &pt : tasks_) {
    const Block &b = p.blocks[pt.task.block];
    pt.chunk = b.chunk;
    pt.forward = b.kind == BlockKind::Forward;
    pt.backward = !pt.forward;
    (pt.forward ? fwdChunks : bwdChunks).insert(b.chunk);
    pt.mbPos = perMb[pt.task.microbatch]++;
    numMb_ = std::max(numMb_, pt.task.microbatch + 1);
    blockMbs_[pt.task.block].insert(pt.task.microbatch);
  }
  for (int c : fwdChunks)
    if (bwdChunks.count(c))
      stashChunks_.insert(c);
  v_ = static_cast<int>(stashChunks_.size());
  mbTasks_.assign(numMb_, 0);
  for (const PoolTask &pt : tasks_)
    ++mbTasks_[pt.task.microbatch];
  for (const PoolTask &pt : tasks_)
    if (pt.backward && stashChunks_.count(pt.chunk))
      ++chunkBwd_[{pt.chunk, pt.task.microbatch}];
  slots_ = std::max(1, p.slots);

  // The cap.
  stash_ = p.stashBytes;
  cap_ = capBytes;
  if (cap_ && !stash_)
    fail("--mem-cap: rank ", p.rank,
         "'s program has no stash_bytes (the plan does not size its "
         "activation stash), so a memory cap cannot be kept");
  if (cap_ && uint64_t(v_) * stash_ > cap_)
    fail("--mem-cap ", cap_, " bytes is below one microbatch's activations "
         "on rank ", p.rank, " (", v_, " chunk(s) x stash_bytes ", stash_,
         " = ", uint64_t(v_) * stash_, " bytes)");
  // How many microbatches the dfc table keeps admitted at most.
  std::vector<int> left = mbTasks_;
  std::vector<bool> started(numMb_, false);
  int open = 0;
  for (const Task &t : tab[DFC]->tasks) {
    if (p.blocks[t.block].kind == BlockKind::Optimizer)
      continue;
    int mb = t.microbatch;
    if (!started[mb]) {
      started[mb] = true;
      ++open;
    }
    dfcMaxOpen_ = std::max(dfcMaxOpen_, open);
    if (--left[mb] == 0)
      --open;
  }
  beginStep();
}

void TaskPool::beginStep() {
  remaining_ = static_cast<int>(tasks_.size());
  mbLeft_ = mbTasks_;
  mbStarted_.assign(numMb_, false);
  slotOwner_.assign(slots_, -1);
  bwdLeft_ = chunkBwd_;
  inflight_.clear();
  reserved_ = 0;
  open_ = 0;
  for (PoolTask &pt : tasks_)
    pt.done = pt.running = false;
  // Blocks' microbatch order: the lowest microbatch of each block first.
  nextMbOfBlock_.clear();
  for (auto &[b, mbs] : blockMbs_)
    nextMbOfBlock_[b] = *mbs.begin();
}

void TaskPool::candidates(std::vector<int> out[2]) const {
  out[DFC].clear();
  out[BFC].clear();
  for (int i = 0; i < static_cast<int>(tasks_.size()); ++i)
    if (waiting(i))
      for (int pol : {DFC, BFC})
        if (admissible(i, pol))
          out[pol].push_back(i);
}

bool TaskPool::nextFits() const {
  return !cap_ || static_cast<uint64_t>(reserved_ + v_) * stash_ <= cap_;
}

int TaskPool::pick(const std::vector<int> &pool, int policy,
                   const std::vector<char> *ok) const {
  int best = -1;
  for (int i : pool)
    if ((!ok || (*ok)[i]) &&
        (best < 0 || tasks_[i].rank[policy] < tasks_[best].rank[policy]))
      best = i;
  return best;
}

bool TaskPool::waiting(int i) const {
  const PoolTask &pt = tasks_[i];
  if (pt.done || pt.running)
    return false;
  int mb = pt.task.microbatch;
  if (nextMbOfBlock_.at(pt.task.block) != mb)
    return false;
  // The tasks of this microbatch before it in the table have run (they run
  // in table order, so counting them is enough).
  if (mbTasks_[mb] - mbLeft_[mb] != pt.mbPos)
    return false;
  int owner = slotOwner_[mb % slotOwner_.size()];
  return owner < 0 || owner == mb;
}

bool TaskPool::admissible(int i, int policy) const {
  if (mbStarted_[tasks_[i].task.microbatch])
    return true;
  if (!nextFits())
    return false;
  return policy == BFC || open_ < dfcMaxOpen_;
}

void TaskPool::start(int i) {
  PoolTask &pt = tasks_[i];
  int mb = pt.task.microbatch;
  if (!mbStarted_[mb]) {
    mbStarted_[mb] = true;
    slotOwner_[mb % slotOwner_.size()] = mb;
    reserved_ += v_;
    ++open_;
  }
  if (pt.forward && stashChunks_.count(pt.chunk))
    inflight_.insert({pt.chunk, mb});
  peakStash_ = std::max<uint64_t>(
      peakStash_, static_cast<uint64_t>(inflight_.size()) * stash_);
  pt.running = true;
}

bool TaskPool::finish(const Task &t) {
  for (PoolTask &pt : tasks_) {
    if (!pt.running || pt.task.block != t.block ||
        pt.task.microbatch != t.microbatch)
      continue;
    pt.running = false;
    pt.done = true;
    --remaining_;
    int mb = t.microbatch;
    const std::set<int> &mbs = blockMbs_.at(t.block);
    auto next = mbs.upper_bound(mb);
    nextMbOfBlock_[t.block] =
        next == mbs.end() ? std::numeric_limits<int>::max() : *next;
    if (pt.backward && stashChunks_.count(pt.chunk)) {
      auto key = std::make_pair(pt.chunk, mb);
      if (--bwdLeft_[key] == 0) {
        inflight_.erase(key);
        --reserved_;
      }
    }
    if (--mbLeft_[mb] == 0) {
      slotOwner_[mb % slotOwner_.size()] = -1;
      --open_;
    }
    return true;
  }
  return false;
}
