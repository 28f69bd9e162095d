// The NCCL backend against the mpi backend, one process per rank and GPU (mpirun -np N): every
// exchange and reduction of nccl_checks.h, bitwise against MPI's. NCCL refuses two ranks on one
// GPU, so with fewer GPUs than ranks on any rank every rank prints why and exits 77 (CTest's
// skip code). A failed check ends the job through Communicator::fail.
#include <cstdio>

#include "distca/comm/mpi.h"
#include "nccl_checks.h"

int main(int argc, char** argv) {
  using namespace distca;        // NOLINT(google-build-using-namespace)
  using namespace distca::comm;  // NOLINT(google-build-using-namespace)
  auto mpi = make_mpi_communicator(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "distca: error: %s\n", mpi.status().to_string().c_str());
    return 1;
  }
  Communicator& boot = *mpi.value();
  auto counts = boot.all_gather_value(cuda_device_count());
  if (!counts.ok()) boot.fail(counts.status());
  for (int p = 0; p < boot.size(); ++p) {
    if (counts.value()[static_cast<size_t>(p)] < boot.size()) {
      if (boot.rank() == 0) {
        std::printf("SKIPPED: %d ranks need %d GPUs (NCCL refuses two ranks on one GPU); rank %d sees %d\n",
                    boot.size(), boot.size(), p, counts.value()[static_cast<size_t>(p)]);
      }
      return 77;
    }
  }
  NcclOptions o;
  o.timeout_s = 60;
  auto nc = make_nccl_communicator(boot, o);
  if (!nc.ok()) boot.fail(nc.status());
  Status st = testing::check_nccl(boot, *nc.value());
  if (!st.ok()) boot.fail(st);
  nc.value().reset();
  if (boot.rank() == 0) std::printf("comm_nccl_mpi_test: all checks passed on %d ranks\n", boot.size());
  return 0;
}
