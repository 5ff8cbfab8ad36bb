// tprun: one process per accelerator, started by mpirun, srun or torchrun-style launchers.
#include "cli/command.h"

int main(int argc, char** argv) { return tprun::cli::run_cli(argc, argv); }
