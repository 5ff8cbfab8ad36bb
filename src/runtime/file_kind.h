#pragma once
// What a path that is not a regular file or a folder is, in words, for the
// messages of every reader that refuses one (a requests file, an adapter):
// "a character device", "a block device", "a pipe", "a socket", or "not a
// regular file" for anything else. `mode` is a stat() st_mode.

#include <sys/types.h>

namespace tprun {

const char* special_file_kind(mode_t mode);

}  // namespace tprun
