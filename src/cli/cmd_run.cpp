// `tprun run MANIFEST`: the batch job (jobs/job_runner.h).
#include <fmt/format.h>

#include "cli/command.h"
#include "cli/session_options.h"
#include "dist/control_plane.h"
#include "jobs/job_runner.h"
#include "jobs/output_folder.h"
#include "runtime/error.h"
#include "dist/session.h"

namespace tprun::cli {

Command run_command() {
  Command c;
  c.name = "run";
  c.summary = "a batch job: tprun run jobs/x.toml [--out DIR] [--set key=value ...] [--retry-failed]";
  c.usage = "MANIFEST";
  c.add_options = [](po::options_description& desc, po::positional_options_description& pos) {
    po::options_description o("Job");
    o.add_options()
        ("manifest", po::value<std::string>(), "the job manifest (TOML); see docs/jobs.md 'Manifest reference'")
        ("out", po::value<std::string>(), "output folder (overrides output.dir; relative to the current folder)")
        ("set", po::value<std::vector<std::string>>()->composing(),
         "override any manifest key: --set defaults.steps=4 --set parallel.tp=2 (repeatable)")
        ("retry-failed", po::bool_switch(), "also rerun the requests recorded 'failed'")
        ("shard", po::value<std::string>(),
         "run chunk I of N of the requests (I/N, or 'slurm' in a job array) into <output.dir>/shard-I-of-N; "
         "merge the chunks with tprun merge-results")
        ("status-file", po::value<std::string>(),
         "rank 0 writes {\"exit_code\": N, \"state\": ...} here when the run ends (for requeue scripts: "
         "tprun's own verdict, whatever the launcher returns); an existing file only if it holds a tprun status")
        ("progress", po::value<std::string>()->default_value("auto"),
         "auto (a live line on a terminal, log lines otherwise) | live | log | none");
    desc.add(o);
    add_session_options(desc);
    pos.add("manifest", 1);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    if (!vm.count("manifest")) throw ConfigError("the manifest is required: tprun run jobs/x.toml", true);
    jobs::RunOptions o;
    o.manifest = vm["manifest"].as<std::string>();
    if (vm.count("set")) {
      for (const auto& s : vm["set"].as<std::vector<std::string>>()) o.overrides.push_back(jobs::parse_override(s));
    }
    if (vm.count("out")) {
      // As a TOML string, whatever the folder name looks like.
      std::string quoted = "\"";
      for (char ch : vm["out"].as<std::string>()) {
        if (ch == '"' || ch == '\\') quoted += '\\';
        quoted += ch;
      }
      o.overrides.emplace_back("output.dir", quoted + "\"");
    }
    o.retry_failed = vm["retry-failed"].as<bool>();
    if (vm.count("shard")) jobs::parse_shard(vm["shard"].as<std::string>(), o);
    if (vm.count("status-file")) o.status_file = vm["status-file"].as<std::string>();
    o.progress = vm["progress"].as<std::string>();
    if (o.progress != "auto" && o.progress != "live" && o.progress != "log" && o.progress != "none") {
      throw ConfigError(fmt::format("--progress {}: not one of auto, live, log, none", o.progress), true);
    }
    jobs::install_stop_handlers();
    Session session(argc, argv, session_options_from(vm));
    if (!o.status_file.empty()) {
      // Before the run (which writes the status file however it ends): a
      // refused status file is never written. Rank 0 decides, every rank stops.
      dist::ControlPlane control(session.watchdog());
      control.agree([&] { jobs::check_status_file(o.status_file, o.manifest, o.overrides); });
    }
    return jobs::run_job(session, o);
  };
  return c;
}

}  // namespace tprun::cli
