#pragma once
// Where a job's outputs go, and who may write there.
//
// OutputLock: one run per output folder. The writer (world rank 0 of
// `tprun run`) takes an exclusive flock(2) on <dir>/.tprun.lock for the whole
// run and writes "pid N host H" into it; the kernel releases the lock when the
// process ends in any way, so a killed run never leaves a stale lock (the file
// stays; its content is only informative). On NFS, Linux emulates flock with
// whole-file POSIX locks, which other clients see (NFSv4, or v3 with lockd)
// unless the mount uses local_lock=flock|all; on Lustre flock is cluster-wide
// only with the `flock` mount option (`localflock`: this node only;
// `noflock`: refused, and the run goes on unlocked with a warning).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tprun::memory {
struct MemoryOptions;
}

namespace tprun::jobs {

struct Manifest;

class OutputLock {
 public:
  // Takes the lock on `dir` (which must exist). ConfigError "output folder
  // <dir> in use by pid N on HOST" when another process holds it; IoError
  // naming the lock file when it cannot be created. Where the file system has
  // no locks, returns a lock that holds nothing and sets `unsupported`.
  // The lock file is opened without following a symlink: a lock path that is
  // a symlink or not a regular file is a ConfigError naming it.
  static std::unique_ptr<OutputLock> acquire(const std::string& dir);
  // A reader's lock (merge-results reading a finished chunk): a shared flock
  // on an existing <dir>/.tprun.lock, opened read-only without following a
  // symlink. A missing lock file gives a lock that holds nothing and creates
  // nothing in `dir`. ConfigError "output folder <dir> in use by pid N on
  // HOST" while a run holds the lock; ConfigError for a lock path that is not
  // a regular file.
  static std::unique_ptr<OutputLock> acquire_shared(const std::string& dir);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Why the file system refused locking ("" when held).
  const std::string& unsupported() const { return unsupported_; }

 private:
  OutputLock() = default;
  std::string path_, unsupported_;
  int fd_ = -1;
};

inline constexpr const char* kLockFileName = ".tprun.lock";

// `p` made absolute with the symlinks of its existing part resolved and made
// normal, without a trailing separator: "model/x/../transformer/w" and a
// symlinked folder both name the real place.
std::filesystem::path real_path(const std::string& p);
// `child` is `parent` or lies below it (both as real_path gives them).
bool path_within(const std::filesystem::path& child, const std::filesystem::path& parent);

// Checks, without writing anything, that `m.output_dir` may hold a job's
// outputs: not the model folder nor inside it (ConfigError naming the
// manifest and output.dir), not a file. Returns a warning ("" if none) for a
// folder that is not empty (a `logs` folder aside) and holds no tprun results
// (results.jsonl, the lock file, images/, store/).
std::string check_output_placement(const Manifest& m);

// For a single output file (`generate --out`): its folder exists and is a
// folder (ConfigError naming `option`), the path is not a folder, and a file
// can be created there now (IoError naming the path and the errno text:
// read-only file system, permission, no space). Leaves nothing behind.
void check_output_file(const std::string& path, const std::string& option);

// ---- every path tprun writes -------------------------------------------------

// What an output path will hold; an existing file there is replaced only when
// tprun wrote it (Png: a "Software: tprun ..." text chunk; Mp4: the comment
// tag "tprun ..." (mp4_file.h); Tensors: the safetensors metadata tprun's
// writer adds; Status: a JSON object with exit_code and state). Folder: a
// folder tprun writes files into (offload, shard). Forced: a file the user
// asked to replace (`convert --force`): only the rules on what the command
// reads apply.
enum class OutputKind { Png, Tensors, Status, Folder, Forced, Mp4 };

// A path the command reads: `what` names it in messages ("the model folder").
struct ReadPath {
  std::string what;
  std::string path;
};

// Refuses (ConfigError naming `option` and `path`, marked as raised on every
// rank: every rank checks the same paths) an output path that
//  - lies inside a folder the command reads (the model), or is that folder;
//  - is a file the command reads, by path or as a hard link / symlink to it
//    (compared by device and inode, symlinks resolved; every file below a read
//    folder counts, so a weight reached through a Hugging Face cache symlink
//    does too);
//  - exists and is not something tprun wrote of this `kind` (or not a folder,
//    for Folder).
// Writes nothing. Call it before any work, before the model loads.
void check_output_path(const std::string& path, const std::string& option, const std::vector<ReadPath>& reads,
                       OutputKind kind);

// Why the thing at `path` is not something tprun wrote of `kind` ("" when it
// is, and when nothing is there): "is a symbolic link that leads nowhere
// (...)", "is a folder", "exists and is not a regular file", "exists and is
// not a PNG tprun wrote (...)" (Forced: any regular file; Folder: any folder).
// A symlink is judged by what it leads to: replacing the link itself loses
// nothing. The rule check_output_path and place_output_file apply.
std::string foreign_output(const std::string& path, OutputKind kind);

// What a job reads: its manifest, the model folder and the requests file.
std::vector<ReadPath> job_inputs(const Manifest& m);

// `tprun run --status-file`: check_output_path against what the manifest
// reads (when it parses: otherwise against the manifest alone; its errors
// are reported by the run itself), and never the job's results.jsonl or lock
// file. Called on every rank before the run starts, so a refused status file
// is never written.
void check_status_file(const std::string& status_file, const std::string& manifest,
                       const std::vector<std::pair<std::string, std::string>>& overrides);

// The memory.offload.disk_path and memory.offload_folder folders of `m`
// checked against what the job reads (the messages name the manifest and
// the key). For the CLI's --memory, `where` is "--memory" and `reads` the
// command's inputs.
void check_offload_folders(const memory::MemoryOptions& mo, const std::string& where,
                           const std::vector<ReadPath>& reads);

// ---- inside an output folder: what tprun makes there ----------------------------
// (output_folder_place.cpp)
//
// tprun never follows a symbolic link at a name it creates inside an output
// folder (images/, store/, results.jsonl, shard-I-of-N/, embeddings/, the
// temporaries): a write through it would land outside the folder. The folder
// the user names (--out, output.dir) may itself be reached through symlinks.

enum class EntryKind { Folder, File };

// `dir`/`name` is absent or a real folder (Folder) / regular file (File), not
// a symbolic link. ConfigError "<dir>/<name> is a symbolic link (to T); tprun
// does not follow it inside an output folder (its files would land outside):
// remove it, or choose another output folder"; likewise for the wrong kind.
void check_output_entry(const std::filesystem::path& dir, const std::string& name, EntryKind kind);

// Creates the folder `dir`/`name` if it is absent (mkdir(2), which never
// follows a symlink) and checks it as check_output_entry does. Returns the
// path. IoError naming it when it cannot be created.
std::filesystem::path make_output_folder(const std::filesystem::path& dir, const std::string& name);

// `rel` (a relative path inside `dir`, e.g. "images/sub/a.png"): every folder
// along it below `dir` created as make_output_folder does (none a symlink).
// Returns dir/rel's folder.
std::filesystem::path make_output_folders(const std::filesystem::path& dir, const std::string& rel);

// A fresh, empty temporary file next to `path` (".<name>.tmp-XXXXXX",
// O_EXCL: never an existing file or a symlink), removed again by the
// destructor unless placed. The names is_output_temp recognises.
class OutputTemp {
 public:
  explicit OutputTemp(const std::string& path);
  ~OutputTemp();
  OutputTemp(const OutputTemp&) = delete;
  OutputTemp& operator=(const OutputTemp&) = delete;
  const std::string& path() const { return tmp_; }
  // The temporary now holds the output: place_output_file(path(), target, kind).
  void place(OutputKind kind);

 private:
  std::string target_, tmp_;
  bool placed_ = false;
};

// Whether `name` is a temporary that tprun's writers make (".<name>.tmp-X",
// ".<name>.tmp"): what resume removes from an output folder it holds.
bool is_output_temp(const std::string& name);

// Puts the finished temporary `tmp` (in the folder of `path`) at `path`,
// never replacing a file tprun did not write, race-free:
//  - nothing there: link(2) / RENAME_NOREPLACE, which fail if a file appears;
//  - a file tprun wrote of `kind` (foreign_output): swapped in with
//    RENAME_EXCHANGE and the displaced file checked again; if it is not one
//    of tprun's after all (someone put it there since), it is swapped back;
//  - anything else: ConfigError naming `path`: "exists and is not a PNG
//    tprun wrote (...); tprun never replaces a file it did not write: move it
//    away, or choose another output path".
// `tmp` is gone afterwards in every case. IoError for a failed rename.
void place_output_file(const std::string& tmp, const std::string& path, OutputKind kind);

// rename(2) that never replaces `to`: RENAME_NOREPLACE, or link(2) + unlink
// where the file system lacks the flag. 0, or the errno (EEXIST: `to` exists;
// `from` stays in place on any failure).
int rename_no_replace(const std::string& from, const std::string& to);

// Puts `tmp` at `path` only when nothing is there (RENAME_NOREPLACE, else
// link(2)): a name that is taken is a ConfigError naming it ("tprun never
// replaces a file it did not write"). `tmp` is gone afterwards in every case.
void place_new_file(const std::string& tmp, const std::string& path);

// write_png (pipelines/png_image.h) into an OutputTemp, then placed with
// place_output_file(Png): `path` is a new file or a PNG tprun wrote. A PNG
// holds one image: `frames` other than 1 (a frame sequence) is a
// RequestError naming the path and the count, before anything is written
// (never its first frame alone).
void write_png_output(const std::string& path, const uint8_t* rgb, int width, int height, int64_t frames,
                      const std::vector<std::pair<std::string, std::string>>& text);
// "" when a result of `frames` frames can go into a PNG (frames = 1), else why
// not ("a PNG holds one image; the result has 9 frames ...").
std::string png_frames_problem(int64_t frames);

}  // namespace tprun::jobs
