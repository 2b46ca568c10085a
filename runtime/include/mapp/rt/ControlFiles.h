//===- ControlFiles.h - tokens and files of the control channel -*- C++ -*-===//
//
// The control channel's secrets live in files only the user can read: the
// job writes a token file (0600, created with O_EXCL|O_NOFOLLOW, never
// through a planted link) and mapp-scope reads it back, refusing a file that
// another user owns or others can read. Control files written for a job go
// through a unique temporary file in the target's folder and a rename, so a
// reader never sees half a file and no fixed temporary name can be planted.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CONTROLFILES_H
#define MAPP_RT_CONTROLFILES_H

#include <cstddef>
#include <string>

namespace mapp::rt {

/// 32 bytes from /dev/urandom as 64 lowercase hex digits.
std::string randomToken();

/// Equal strings, compared in time independent of where they differ.
bool tokensEqual(const std::string &a, const std::string &b);

/// Creates `path` with mode 0600 and writes `content`. A stale regular file
/// or symlink at `path` is unlinked first (the link, never its target); the
/// new file is created with O_CREAT|O_EXCL|O_NOFOLLOW, so a link planted in
/// between makes this fail instead of writing through it.
void writePrivateFile(const std::string &path, const std::string &content);

/// Reads `path` (at most `cap` bytes) after checking that it is a regular
/// file (not a link), owned by this user and not readable or writable by
/// group or others; Error naming the problem otherwise.
std::string readPrivateFile(const std::string &path, size_t cap = 4096);

/// Replaces `path` with `content` through a unique temporary file created
/// with O_EXCL in the same folder, fsync and rename.
void replaceFileAtomically(const std::string &path, const std::string &content);

/// What a job's control token file holds: {"port": P, "token": "…"}.
struct ControlCredentials {
  int port = 0;
  std::string token;
};
std::string formatControlCredentials(const ControlCredentials &c);
/// Reads and checks a token file (readPrivateFile); Error when malformed.
ControlCredentials readControlCredentials(const std::string &path);

/// The token file of a job's control port when none is named: beside the
/// probe store, `DB.control-token` (rank r > 0: `DB.control-token.rank<r>`).
std::string defaultControlTokenFile(const std::string &db, int rank = 0);

} // namespace mapp::rt

#endif
