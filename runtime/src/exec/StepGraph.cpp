//===- StepGraph.cpp - when a training step is captured or replayed -------===//
#include "mapp/rt/StepGraph.h"
#include "mapp/rt/Error.h"

#include <sstream>

using namespace mapp::rt;

std::string StepGraphKey::str() const {
  std::ostringstream os;
  os << "schedule=" << (schedule.empty() ? "-" : schedule) << " switches=[";
  for (size_t i = 0; i < switches.size(); ++i)
    os << (i ? "," : "") << switches[i].first << ":" << switches[i].second;
  os << "] loss_scale=" << lossScale;
  if (traceBank >= 0)
    os << " trace_bank=" << traceBank;
  return os.str();
}

StepGraphCache::StepGraphCache(size_t capacity) : capacity_(capacity) {
  if (capacity_ == 0)
    fail("StepGraphCache: capacity must be at least 1");
}

StepGraphAction StepGraphCache::next(const StepGraphKey &key, uint64_t &id) {
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
    if (it->key == key) {
      graphs_.splice(graphs_.begin(), graphs_, it); // most recently used
      id = it->id;
      ++replays_;
      warm_ = false; // a later new key warms up again
      return StepGraphAction::Replay;
    }
  bool sameWork = false; // another trace bank of a captured step
  for (const Entry &e : graphs_)
    sameWork |= e.key.sameWork(key);
  if ((warm_ && warmKey_.sameWork(key)) || sameWork) {
    // The step before ran eagerly under this key (or the same work was
    // captured): everything it allocates lazily exists now, so this one
    // can be captured.
    if (graphs_.size() == capacity_) {
      evicted_.push_back(graphs_.back().id);
      graphs_.pop_back();
    }
    id = nextId_++;
    graphs_.push_front({key, id});
    warm_ = false;
    ++captures_;
    return StepGraphAction::Capture;
  }
  warmKey_ = key;
  warm_ = true;
  id = 0;
  ++eager_;
  return StepGraphAction::Eager;
}

void StepGraphCache::forget(uint64_t id) {
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
    if (it->id == id) {
      evicted_.push_back(id);
      graphs_.erase(it);
      return;
    }
}

void StepGraphCache::clear() {
  for (const Entry &e : graphs_)
    evicted_.push_back(e.id);
  graphs_.clear();
  warm_ = false;
}

std::vector<uint64_t> StepGraphCache::takeEvicted() {
  std::vector<uint64_t> out;
  out.swap(evicted_);
  return out;
}
