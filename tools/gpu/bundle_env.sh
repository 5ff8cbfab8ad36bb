# Sourced by run.sh and check_bundle.sh (bash): the environment an unpacked GPU bundle runs in.
#   bundle_env WORK TORCH_DIR   WORK: the unpacked payload; TORCH_DIR: the host's torch package folder
# libtorch from TORCH_DIR/lib and CUDA's libraries from the nvidia wheels beside it; everything else
# from WORK/lib; Open MPI and PMIx from WORK/mpi whatever their configure-time paths were; no ssh is
# needed (one node: mpirun and a singleton's daemon are started locally).
# The libraries a bundle takes from the host, never carries: the C and C++ runtime (by soname).
# tools/gpu-bundle.sh leaves them out and tools/gpu/check_bundle.sh allows them: one list for both.
BUNDLE_HOST_LIBS_RE='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil\.so|ld-linux|libstdc\+\+|libgcc_s|libresolv|libanl)'

bundle_env() {
  local work=$1 torch_dir=$2 libpath d m
  libpath=$work/lib:$torch_dir/lib
  for d in "$torch_dir"/../nvidia/*/lib; do [ -d "$d" ] && libpath=$libpath:$(cd "$d" && pwd); done
  export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  m=$work/mpi
  export OPAL_PREFIX=$m OPAL_EXEC_PREFIX=$m OPAL_BINDIR=$m/bin OPAL_LIBDIR=$work/lib OPAL_PKGLIBDIR=$m/lib/openmpi3 \
    OPAL_DATAROOTDIR=$m/share OPAL_DATADIR=$m/share OPAL_PKGDATADIR=$m/share/openmpi OPAL_SYSCONFDIR=$m/etc
  export PMIX_INSTALL_PREFIX=$m/pmix PMIX_EXEC_PREFIX=$m/pmix PMIX_LIBDIR=$m/pmix/lib PMIX_PKGLIBDIR=$m/pmix/lib/pmix \
    PMIX_DATADIR=$m/pmix/share PMIX_PKGDATADIR=$m/pmix/share/pmix PMIX_SYSCONFDIR=$m/etc \
    PMIX_MCA_mca_base_component_path=$m/pmix/lib/pmix
  export OMPI_MCA_mca_base_component_path=$m/lib/openmpi3 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false
  export PATH=$m/bin:$PATH TPRUN_SRC=$work/src
}
