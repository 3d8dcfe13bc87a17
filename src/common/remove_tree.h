#pragma once
// Removing a directory tree that untrusted processes can write (the CUDA interposer's accounting
// directories are 0777 so that random-UID containers write them): every level is opened with
// O_NOFOLLOW relative to its parent and symbolic links are unlinked as entries, so a link planted
// in the tree never turns root's removal into one elsewhere.
//
// Thread-safety: reentrant.

#include <string>

#include "absl/status/status.h"

namespace kgpu {

// Removes `dir` and everything under it (nested at most 16 levels). A `dir` that does not exist is
// OK. Errors name the entry and the step ("rmdir <name>: <why>").
absl::Status RemoveTreeNoFollow(const std::string& dir);

}  // namespace kgpu
