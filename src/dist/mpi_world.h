#pragma once
// MPI process setup: init/finalize, identity, nodes, abort, error checks.

#include <string>
#include <vector>

#include <mpi.h>

#include "runtime/rank_env.h"

namespace tprun::dist {

// MPI_Init_thread (idempotent). World errors are returned, not fatal, so that
// tprun turns them into CommErrors with a message.
void mpi_init(int* argc, char*** argv);
bool mpi_is_initialized();
bool mpi_is_finalized();
void mpi_finalize() noexcept;

// Rank and world of MPI_COMM_WORLD, and local rank/size within this node's
// shared-memory domain.
MpiIdentity mpi_identity();

// For every world rank, the index of its node (nodes numbered in order of
// their lowest world rank). Collective over MPI_COMM_WORLD.
std::vector<int> mpi_node_of_rank();

// Gathers one string per rank of `comm` to every rank (collective).
std::vector<std::string> mpi_all_gather_strings(MPI_Comm comm, const std::string& mine);

std::string host_name();

// Throws CommError "<what> failed: <MPI error string>" if rc != MPI_SUCCESS.
void check_mpi(int rc, const char* what);

// Ends the whole job now (MPI_Abort on MPI_COMM_WORLD, or _exit when MPI is
// not running). Flushes logs first.
[[noreturn]] void abort_job(int exit_code) noexcept;

}  // namespace tprun::dist
