// `tprun env`: how the launcher, the mesh and the devices look from every rank.
#include <iostream>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/session_options.h"
#include "dist/device_mesh.h"
#include "dist/mpi_world.h"
#include "dist/session.h"

namespace tprun::cli {

Command env_command() {
  Command c;
  c.name = "env";
  c.summary = "print each rank's environment, device, threads and mesh position (rank order)";
  c.add_options = [](po::options_description& desc, po::positional_options_description&) {
    po::options_description mesh("Mesh");
    mesh.add_options()
        ("tp", po::value<int>()->default_value(1), "tensor-parallel group size")
        ("dp", po::value<int>()->default_value(0), "data-parallel replicas (0: world / tp)")
        ("allow-cross-node-tp", po::bool_switch(), "let a TP group span nodes");
    desc.add(mesh);
    add_session_options(desc);
  };
  c.run = [](const po::variables_map& vm, int* argc, char*** argv) {
    Session session(argc, argv, session_options_from(vm));
    dist::MeshSpec spec;
    spec.tp = vm["tp"].as<int>();
    spec.dp = vm["dp"].as<int>();
    spec.allow_cross_node_tp = vm["allow-cross-node-tp"].as<bool>();
    auto mesh = session.make_mesh(spec);
    const auto& env = session.env();
    const int r = session.rank();
    const std::string line = fmt::format(
        "rank {}/{} host={} local={}/{} device={} threads={} env={} dp={}/{} tp={}/{} "
        "tp_group={} dp_peers={}",
        r, session.world(), session.host(), env.local_rank, env.local_size,
        session.device().device, session.threads(), env.source, mesh->dp_rank(), mesh->dp_size(),
        mesh->tp_rank(), mesh->tp_size(), dist::format_ranks(mesh->layout().tp_group_of(r)),
        dist::format_ranks(mesh->layout().dp_peers_of(r)));
    auto lines = dist::mpi_all_gather_strings(MPI_COMM_WORLD, line);
    if (r == 0) {
      for (const auto& l : lines) std::cout << l << "\n";
      std::cout.flush();
    }
    return 0;
  };
  return c;
}

}  // namespace tprun::cli
