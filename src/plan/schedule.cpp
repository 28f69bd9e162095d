// Scheduler names and option checks (schedule.h). The dispatcher is in run_scheduler.cpp; the
// schedulers live in baselines.cpp (colocated, wlb, percp) and the communication-aware files.
#include "distca/plan/schedule.h"

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include "distca/cost/options.h"
#include "distca/plan/chunking.h"

namespace distca {
namespace {

constexpr const char* kExpected = "expected colocated, wlb, percp:C, cad or cad-symmetric";

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string SchedulerSpec::name() const {
  switch (kind) {
    case SchedulerKind::kColocated: return "colocated";
    case SchedulerKind::kWlb: return "wlb";
    case SchedulerKind::kPerCp: return "percp:" + std::to_string(cp_degree);
    case SchedulerKind::kCad: return "cad";
    case SchedulerKind::kCadSymmetric: return "cad-symmetric";
  }
  return "?";
}

Result<SchedulerSpec> parse_scheduler(const std::string& text) {
  SchedulerSpec spec;
  if (text == "colocated") {
    spec.kind = SchedulerKind::kColocated;
  } else if (text == "wlb") {
    spec.kind = SchedulerKind::kWlb;
  } else if (text == "cad") {
    spec.kind = SchedulerKind::kCad;
  } else if (text == "cad-symmetric") {
    spec.kind = SchedulerKind::kCadSymmetric;
  } else if (text.rfind("percp:", 0) == 0) {
    const std::string digits = text.substr(6);
    bool ok = !digits.empty() && digits.size() <= 9;
    for (char c : digits) ok = ok && c >= '0' && c <= '9';
    if (!ok || std::stoll(digits) < 1) {
      return Status::invalid_argument("--scheduler: '" + text +
                                      "' needs a positive integer CP degree (percp:C)");
    }
    spec.kind = SchedulerKind::kPerCp;
    spec.cp_degree = std::stoll(digits);
  } else {
    return Status::invalid_argument("--scheduler: unknown scheduler '" + text + "' (" + kExpected + ")");
  }
  return spec;
}

Result<std::optional<double>> parse_tolerance(const std::string& text, const std::string& flag) {
  if (text == "auto") return std::optional<double>{};
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    return Status::invalid_argument(flag + " must be auto or a number in [0, 1] (got '" + text + "')");
  }
  if (!std::isfinite(v) || v < 0 || v > 1) return Status::invalid_argument(flag + " must be in [0, 1] (got " + fmt(v) + ")");
  return std::optional<double>{v};
}

Status check_align_rows(int64_t align_rows) {
  if (align_rows < 1 || align_rows > kMaxAlignRows) {
    return Status::invalid_argument("--align-rows must be in [1, " + std::to_string(kMaxAlignRows) + "] (got " +
                                    std::to_string(align_rows) + ")");
  }
  return Status::ok_status();
}

Status check_doc_weights(const std::vector<DocWeight>& weights) {
  for (size_t i = 0; i < weights.size(); ++i) {
    const DocWeight& w = weights[i];
    if (i > 0 && w.doc <= weights[i - 1].doc) {
      return Status::invalid_argument("doc_weights: document ids must be strictly ascending (document " +
                                      std::to_string(w.doc) + " after " + std::to_string(weights[i - 1].doc) + ")");
    }
    if (!std::isfinite(w.weight) || w.weight <= 0 || w.weight > kMaxDocWeight) {
      return Status::invalid_argument("doc_weights: document " + std::to_string(w.doc) + " has weight " + fmt(w.weight) +
                                      ", outside (0, " + fmt(kMaxDocWeight) + "]");
    }
  }
  return Status::ok_status();
}

Status ScheduleOptions::validate(const Batch& batch, const SchedulerSpec& spec) const {
  DISTCA_RETURN_IF_ERROR(batch.validate());
  DISTCA_RETURN_IF_ERROR(model.validate().with_context("--model"));
  if (dtype_bytes != 2 && dtype_bytes != 4) {
    return Status::invalid_argument("--dtype: activation bytes must be 2 (bf16) or 4 (fp32), got " +
                                    std::to_string(dtype_bytes));
  }
  if (!std::isfinite(tolerance) || tolerance < 0 || tolerance > 1) {
    return Status::invalid_argument("--tolerance must be in [0, 1] (got " + fmt(tolerance) + ")");
  }
  if (!std::isfinite(wlb_mem_cap) || wlb_mem_cap < 1) {
    return Status::invalid_argument("--wlb-mem-cap must be >= 1 (got " + fmt(wlb_mem_cap) + ")");
  }
  DISTCA_RETURN_IF_ERROR(check_align_rows(align_rows));
  DISTCA_RETURN_IF_ERROR(check_doc_weights(doc_weights));
  DISTCA_RETURN_IF_ERROR(topology.validate(batch.ranks));
  if (spec.kind == SchedulerKind::kWlb) DISTCA_RETURN_IF_ERROR(wlb_chunking_options(*this).validate(batch.ranks));
  if (spec.kind == SchedulerKind::kPerCp) {
    if (spec.cp_degree < 1 || batch.ranks % spec.cp_degree != 0) {
      return Status::invalid_argument("--scheduler " + spec.name() + ": CP degree " +
                                      std::to_string(spec.cp_degree) + " does not divide the " +
                                      std::to_string(batch.ranks) + " ranks");
    }
  }
  return Status::ok_status();
}

Status make_plan_setup(const ModelSpec& model, const PlanFlags& flags, PlanSetup& setup) {
  DISTCA_ASSIGN_OR_RETURN(setup.spec, parse_scheduler(flags.scheduler));
  ScheduleOptions& options = setup.options;
  options.model = model;
  DISTCA_ASSIGN_OR_RETURN(options.dtype_bytes, dtype_bytes_of(flags.dtype));
  options.tolerance = flags.tolerance;
  options.wlb_mem_cap = flags.wlb_mem_cap;
  options.align_rows = flags.align_rows;
  options.cost = &setup.pairs;
  if (!flags.cost_table.empty()) {
    DISTCA_ASSIGN_OR_RETURN(setup.table, load_cost_table_option(flags.cost_table));
    options.cost = setup.table.get();
  }
  return options.validate(Batch{1, 1, {{{0, 0, 1, 1}}}}, SchedulerSpec{setup.spec.kind, 1});
}

}  // namespace distca
