//===- SaveDir.cpp - what a run may delete in its --save-dir --------------===//
//
// A save directory is shared with whatever else the user keeps there and
// with earlier runs. A run deletes only:
//   * its own temporaries (step-N.RUNID.tmp, RUNID its run id);
//   * temporaries provably abandoned by a job of the same plan: the owner
//     file inside names that run, the plan's seal checksum, the host and the
//     process (pid and its start time); the process is gone (same host) or,
//     from another host, nothing in the folder changed since this run began;
//   * step folders of its own lineage beyond --save-keep (its checkpoints
//     and those of the runs it resumed from, up to the step it left each);
//   * step folders the user named for replacement (--save-dir-overwrite).
// Everything else (another run's checkpoints, folders without a manifest,
// `my-results.tmp/`) is left alone. Removal goes through a rename to a
// temporary of this run first, so a kill during it never leaves a step
// folder without its manifest.
//
//===----------------------------------------------------------------------===//
#include "CheckpointInternal.h"

#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace mapp::rt;
using namespace mapp::rt::ckpt;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char *kOwnerFile = "mapp-owner.json";

std::string hostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0)
    return "";
  return buf;
}

/// The start time of process `pid` (clock ticks since boot, /proc field 22):
/// tells a live process from a later one that reused its pid. "" if unknown.
std::string processStart(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat))
    return "";
  size_t paren = stat.rfind(')'); // the command name may hold spaces
  if (paren == std::string::npos)
    return "";
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22)
      return field;
  return "";
}

bool processAlive(long pid, const std::string &start) {
  if (pid <= 0)
    return true; // unknown: never taken for dead
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
    return false;
  std::string now = processStart(pid);
  return now.empty() || start.empty() || now == start;
}

/// The run id of a temporary's name (temporaryName), "" when the name is
/// not a mapp temporary.
std::string runOfTemporary(const std::string &name) {
  if (name.size() < 13 + 1 + 16 + 4 || stepOfFolder(name.substr(0, 13)) < 0 ||
      name[13] != '.')
    return "";
  std::string step = name.substr(0, 13), run = name.substr(14, 16);
  for (char c : run)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return "";
  return name == temporaryName(step, run) || name == temporaryName(step, run, true)
             ? run
             : "";
}

void writeOwnerFile(const std::string &folder, const CheckpointMeta &meta) {
  json owner = {{"run", meta.runId},
                {"plan", planHashText(meta.planChecksum)},
                {"host", hostName()},
                {"pid", static_cast<long>(::getpid())},
                {"pid_start", processStart(::getpid())}};
  std::string text = owner.dump(1) + "\n";
  writeFileAtomic(folder + "/" + kOwnerFile, text.data(), text.size());
}

/// The newest modification time of `folder` and the files in it.
fs::file_time_type newestChange(const fs::path &folder) {
  std::error_code ec;
  fs::file_time_type t = fs::last_write_time(folder, ec);
  for (const auto &e : fs::directory_iterator(folder, ec)) {
    std::error_code ec2;
    fs::file_time_type u = e.last_write_time(ec2);
    if (!ec2 && u > t)
      t = u;
  }
  return t;
}

/// Whether temporary `tmp` of run `run` (not this one) was abandoned by a
/// job of this plan: its owner file says so and that job is gone.
bool provablyAbandoned(const fs::path &tmp, const std::string &run,
                       const CheckpointMeta &meta) {
  json owner;
  try {
    // A FIFO planted as the owner file would block the save.
    std::string text, why;
    if (!readRegularFile((tmp / kOwnerFile).string(), text, why))
      return false;
    owner = json::parse(text);
    if (owner.at("run") != run ||
        owner.at("plan") != planHashText(meta.planChecksum))
      return false;
    if (owner.at("host") == hostName())
      return !processAlive(owner.at("pid").get<long>(),
                           owner.at("pid_start").get<std::string>());
  } catch (const std::exception &) {
    return false;
  }
  // Another host: its process cannot be asked; a folder nothing wrote into
  // since this run started belongs to no save in progress.
  auto started = fs::file_time_type::clock::now() -
                 std::chrono::duration_cast<fs::file_time_type::duration>(
                     std::chrono::system_clock::now() - meta.started);
  return newestChange(tmp) < started;
}

void removeFolder(const fs::path &p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec)
    fail("--save-dir: cannot remove '", p.string(), "': ", ec.message());
}

} // namespace

bool mapp::rt::inLineage(const CheckpointMeta &meta, const std::string &runId,
                         int64_t step) {
  if (runId == meta.runId)
    return true;
  for (const LineageLink &a : meta.ancestors)
    if (a.runId == runId && step <= a.step)
      return true;
  return false;
}

SaveDirScan mapp::rt::scanSaveDir(const std::string &dir,
                                  const CheckpointMeta &meta,
                                  int64_t startStep) {
  SaveDirScan scan;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return scan;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    int64_t n = stepOfFolder(e.path().filename().string());
    std::error_code ec2;
    if (n >= 0 && e.is_directory(ec2))
      steps.emplace_back(n, e.path());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto &[n, path] : steps) {
    FolderOwner o = ownerOfCheckpoint(path.string());
    if (o.problem == "no manifest.json")
      scan.incomplete.push_back(path.string());
    if (n <= startStep || (o.known && inLineage(meta, o.runId, n)))
      continue;
    scan.newer.push_back(path.filename().string() +
                         (o.known ? " (run " + o.runId + ")"
                                  : " (" + o.problem + ")"));
    scan.newerPaths.push_back(path.string());
  }
  return scan;
}

std::string mapp::rt::ckpt::beginTemporary(const std::string &dir,
                                           int64_t step,
                                           const CheckpointMeta &meta) {
  std::error_code ec;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    std::string run = runOfTemporary(e.path().filename().string());
    std::error_code ec2;
    if (run.empty() || !e.is_directory(ec2))
      continue; // not a temporary of mapp's: never touched
    if (run == meta.runId || provablyAbandoned(e.path(), run, meta))
      removeFolder(e.path());
  }
  if (ec)
    fail("--save-dir: cannot list '", dir, "': ", ec.message());
  std::string tmp = dir + "/" + temporaryName(stepFolderName(step), meta.runId);
  fs::create_directory(tmp, ec);
  if (ec)
    fail("--save-dir: cannot create '", tmp, "': ", ec.message());
  writeOwnerFile(tmp, meta);
  return tmp;
}

void mapp::rt::ckpt::retireFolder(const std::string &dir,
                                  const std::string &folder,
                                  const CheckpointMeta &meta) {
  std::string tmp = dir + "/" + temporaryName(fs::path(folder).filename().string(),
                                             meta.runId, true);
  removeFolder(tmp); // this run's own leftover, if any
  writeOwnerFile(folder, meta);
  std::error_code ec;
  fs::rename(folder, tmp, ec);
  if (ec)
    fail("--save-dir: cannot move '", folder, "' aside: ", ec.message());
  fsyncDir(dir);
  removeFolder(tmp);
}

void mapp::rt::ckpt::pruneLineage(const std::string &dir,
                                  const CheckpointMeta &meta, int keep) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> mine;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    int64_t n = stepOfFolder(e.path().filename().string());
    std::error_code ec2;
    if (n < 0 || !e.is_directory(ec2))
      continue;
    FolderOwner o = ownerOfCheckpoint(e.path().string());
    if (o.known && inLineage(meta, o.runId, n))
      mine.emplace_back(n, e.path());
  }
  std::sort(mine.rbegin(), mine.rend());
  for (size_t i = static_cast<size_t>(keep); i < mine.size(); ++i)
    retireFolder(dir, mine[i].second.string(), meta);
}
