// distca.Batch and distca.workload (docs/python.md): the batch a plan is made for, built from
// pieces, packed from document lengths, read from a `--batch` file, or drawn like
// `distca workload` draws it (same options, same messages, same bits).
#include <pybind11/stl.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "bind_common.h"
#include "distca/core/io.h"
#include "distca/core/memory.h"
#include "distca/data/batch_memory.h"
#include "distca/data/json_field.h"
#include "distca/data/workload.h"

namespace distca::python {
namespace {

PyBatch wrap(Batch b) {
  PyBatch out;
  out.batch = std::make_shared<const Batch>(std::move(b));
  return out;
}

using PieceTuple = std::tuple<int64_t, int64_t, int64_t, int64_t>;

PyBatch from_pieces(const std::vector<std::vector<PieceTuple>>& per_rank, int64_t tokens_per_rank) {
  Batch b;
  b.ranks = static_cast<int64_t>(per_rank.size());
  b.tokens_per_rank = tokens_per_rank;
  for (const auto& rank : per_rank) {
    auto& out = b.per_rank.emplace_back();
    for (const auto& [doc, offset, len, doc_len] : rank) out.push_back(Piece{doc, offset, len, doc_len});
  }
  check(b.validate());
  return wrap(std::move(b));
}

PyBatch from_lengths(std::vector<int64_t> lengths, int64_t ranks, int64_t tokens_per_rank,
                     const std::string& layout, int64_t max_doc_len) {
  // pack_documents' preconditions, as errors (it checks them fatally); the size bound is the
  // workload's (2^40 tokens per batch) so a typo cannot ask for terabytes.
  if (ranks <= 0) raise_value_error("ranks must be positive (got " + std::to_string(ranks) + ")");
  if (ranks > (int64_t{1} << 24)) raise_value_error("ranks must be at most 16777216 (got " + std::to_string(ranks) + ")");
  if (tokens_per_rank <= 0) {
    raise_value_error("tokens_per_rank must be positive (got " + std::to_string(tokens_per_rank) + ")");
  }
  if (tokens_per_rank > (int64_t{1} << 40) / ranks) {
    raise_value_error("ranks (" + std::to_string(ranks) + ") times tokens_per_rank (" +
                      std::to_string(tokens_per_rank) + ") exceeds 2^40 tokens per batch");
  }
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] <= 0) {
      raise_value_error("lengths[" + std::to_string(i) + "] must be positive (got " + std::to_string(lengths[i]) + ")");
    }
  }
  if (max_doc_len < 0 || (max_doc_len > 0 && max_doc_len < kLengthQuantum)) {
    raise_value_error("max_doc_len must be at least 16, or 0 for no cap (got " + std::to_string(max_doc_len) + ")");
  }
  const Layout l = take(parse_layout(layout));
  // pack_documents' batch: at most a piece per document plus four per rank (head-tail).
  const BatchShape shape{1, static_cast<double>(ranks), static_cast<double>(lengths.size()) + 4.0 * static_cast<double>(ranks)};
  check(check_memory(batches_bytes(shape), "--ranks " + std::to_string(ranks) + " --tokens-per-rank " +
                                               std::to_string(tokens_per_rank) + " (" + std::to_string(lengths.size()) +
                                               " lengths)"));
  // The workload's cap: rounded down to the length quantum, longer documents cut to it.
  const int64_t cap = max_doc_len / kLengthQuantum * kLengthQuantum;
  if (cap > 0) {
    for (int64_t& len : lengths) len = std::min(len, cap);
  }
  Batch b;
  {
    py::gil_scoped_release release;
    b = pack_documents(lengths, ranks, tokens_per_rank, l);
  }
  check(b.validate());
  return wrap(std::move(b));
}

// Batches read (the CLI's readers), wrapped; `file` the file they came from ("" none).
std::vector<PyBatch> wrap_all(std::vector<Batch> batches, const std::string& file) {
  std::vector<PyBatch> out;
  for (Batch& b : batches) {
    out.push_back(wrap(std::move(b)));
    out.back().batch_file = file;
  }
  return out;
}

std::vector<PyBatch> load_batches(const std::string& path) { return wrap_all(take(read_batch_file(path)), path); }

PyBatch workload(const std::string& dist, int64_t ranks, int64_t tokens_per_rank, uint64_t seed,
                 const std::string& layout, int64_t max_doc_len, double long_prob, int64_t batch) {
  WorkloadOptions o;
  o.dist = dist;
  o.ranks = ranks;
  o.tokens_per_rank = tokens_per_rank;
  o.seed = seed;
  o.max_doc_len = max_doc_len;
  o.prolong_long_prob = long_prob;
  if (batch < 0 || batch >= 1000000) {
    raise_value_error("batch must be in [0, 999999] (got " + std::to_string(batch) + ")");
  }
  o.batches = batch + 1;
  // The CLI's order: the options, then the layout, then the draw.
  check(o.validate());
  o.layout = take(parse_layout(layout));
  // `distca workload`'s estimate of the batches drawn (batch + 1 of them: the draw makes
  // every batch before the one asked for).
  check(check_memory(batches_bytes(take(estimate_shape(o))),
                     "--ranks " + std::to_string(ranks) + " --tokens-per-rank " + std::to_string(tokens_per_rank) +
                         " --batches " + std::to_string(o.batches)));
  std::vector<Batch> drawn;
  Status st;
  {
    py::gil_scoped_release release;
    auto r = make_batches(o);
    if (r.ok()) drawn = std::move(r).value();
    else st = r.status();
  }
  check(st);
  PyBatch out = wrap(std::move(drawn.back()));
  out.dist = dist;
  out.layout = layout;
  out.seed = seed;
  out.tokens_per_rank = tokens_per_rank;
  return out;
}

}  // namespace

void bind_batch(py::module_& m) {
  py::class_<PyBatch>(m, "Batch", R"doc(
A packed batch: which pieces of which documents each rank holds (immutable).

A piece is (doc, offset, len, doc_len): rows [offset, offset + len) of document `doc` of
length doc_len. A rank's token buffer is its pieces in order; the pieces of each document
tile [0, doc_len) exactly.

Build one with
  Batch(per_rank, tokens_per_rank)       per_rank[r] = list of (doc, offset, len, doc_len)
  Batch.from_lengths(lengths, ranks, tokens_per_rank, layout="contiguous")
  Batch.load(path) / load_batches(path)  a `distca workload --json --full` file (--batch)
  Batch.from_json(text)                  the same JSON as a string
  workload(dist=..., ranks=..., ...)     drawn exactly as `distca workload` draws it
Invalid batches raise ValueError with the CLI's message.
)doc")
      .def(py::init(&from_pieces), py::arg("per_rank"), py::arg("tokens_per_rank"),
           "Batch from per-rank pieces (doc, offset, len, doc_len); validated.")
      .def_static("from_lengths", &from_lengths, py::arg("lengths"), py::arg("ranks"), py::arg("tokens_per_rank"),
                  py::arg("layout") = "contiguous", py::arg("max_doc_len") = 0, R"doc(
Packs document lengths into `ranks` ranks of `tokens_per_rank` slots in order, as
`distca workload` packs its draws: document i gets id i, documents past the last slot are
dropped, the one crossing the end is cut to fit. layout: "contiguous" or "head-tail"
(every document spanning k >= 2 ranks is re-split into a head and a tail chunk per rank).
max_doc_len: --max-doc-len's cap (0: none; else >= 16, rounded down to a multiple of 16),
applied to the lengths before packing.
)doc")
      .def_static(
          "from_json",
          [](const std::string& text) {
            auto j = parse_json_fields(text, "batch JSON");
            if (!j.ok()) raise_status(j.status());
            auto list = wrap_all(take(batches_from_json(*j, "batch JSON")), "");
            if (list.size() != 1) raise_value_error("batch JSON holds " + std::to_string(list.size()) + " batches");
            list[0].batch_file.clear();
            return list[0];
          },
          py::arg("text"), "A batch from JSON text: a bare batch or {\"batch\": ...} (docs/plan-format.md).")
      .def_static(
          "load",
          [](const std::string& path) {
            auto list = load_batches(path);
            if (list.size() != 1) {
              raise_value_error("--batch " + path + ": holds " + std::to_string(list.size()) +
                                " batches (distca.load_batches reads them all)");
            }
            return list[0];
          },
          py::arg("path"), "The batch of a `--batch` file (exactly one); messages name --batch PATH like the CLI.")
      .def_property_readonly("ranks", [](const PyBatch& b) { return b.batch->ranks; })
      .def_property_readonly("tokens_per_rank", [](const PyBatch& b) { return b.batch->tokens_per_rank; })
      .def_property_readonly("num_documents", [](const PyBatch& b) { return b.batch->num_documents(); })
      .def_property_readonly(
          "per_rank",
          [](const PyBatch& b) {
            py::list out;
            for (const auto& rank : b.batch->per_rank) {
              py::list pieces;
              for (const Piece& p : rank) pieces.append(py::make_tuple(p.doc, p.offset, p.len, p.doc_len));
              out.append(pieces);
            }
            return out;
          },
          "list (ranks) of lists of (doc, offset, len, doc_len), a copy")
      .def(
          "pieces",
          [](const PyBatch& b) {
            int64_t n = 0;
            for (const auto& rank : b.batch->per_rank) n += static_cast<int64_t>(rank.size());
            py::array_t<int64_t> out({static_cast<py::ssize_t>(n), py::ssize_t{5}});
            auto w = out.mutable_unchecked<2>();
            py::ssize_t i = 0;
            for (int64_t r = 0; r < b.batch->ranks; ++r) {
              for (const Piece& p : b.batch->per_rank[static_cast<size_t>(r)]) {
                const int64_t row[5] = {r, p.doc, p.offset, p.len, p.doc_len};
                for (int c = 0; c < 5; ++c) w(i, c) = row[c];
                ++i;
              }
            }
            return out;
          },
          "int64 array (pieces, 5): rank, doc, offset, len, doc_len, ranks ascending, each rank's pieces in order")
      .def("rank_tokens", [](const PyBatch& b, int64_t r) {
            if (r < 0 || r >= b.batch->ranks) throw py::index_error("rank " + std::to_string(r) + " out of range");
            return b.batch->rank_tokens(r);
          }, py::arg("rank"), "Tokens (rows of the token buffer) of rank `rank`.")
      .def("to_json", [](const PyBatch& b) {
             // The JSON document and its text, as `workload --full` estimates them.
             check(check_memory(batch_json_bytes(shape_of(*b.batch)), "Batch.to_json of " +
                                std::to_string(b.batch->ranks) + " ranks"));
             return batch_to_json(*b.batch).dump();
           },
           "The batch as the JSON text `--batch` reads.")
      .def_property_readonly("dist", [](const PyBatch& b) -> py::object {
            return b.dist.empty() ? py::object(py::none()) : py::str(b.dist);
          }, "workload()'s dist, or None")
      .def_property_readonly("layout", [](const PyBatch& b) -> py::object {
            return b.dist.empty() ? py::object(py::none()) : py::str(b.layout);
          }, "workload()'s layout, or None")
      .def_property_readonly("seed", [](const PyBatch& b) -> py::object {
            return b.dist.empty() ? py::object(py::none()) : py::int_(b.seed);
          }, "workload()'s seed, or None")
      .def_property_readonly("batch_file", [](const PyBatch& b) -> py::object {
            return b.batch_file.empty() ? py::object(py::none()) : py::str(b.batch_file);
          }, "the file Batch.load read, or None")
      .def("__eq__", [](const PyBatch& a, const PyBatch& b) { return *a.batch == *b.batch; })
      .def("__repr__", [](const PyBatch& b) {
        return "<distca.Batch ranks=" + std::to_string(b.batch->ranks) + " tokens_per_rank=" +
               std::to_string(b.batch->tokens_per_rank) + " documents=" + std::to_string(b.batch->num_documents()) +
               ">";
      });
  m.def("load_batches", &load_batches, py::arg("path"),
        "Every batch of a `--batch` file (bare batch, {\"batch\": ...} or {\"batches\": [...]}).");
  m.def("workload", &workload, py::arg("dist") = "prolong", py::arg("ranks") = 8,
        py::arg("tokens_per_rank") = 512 * 1024, py::arg("seed") = 42, py::arg("layout") = "contiguous",
        py::arg("max_doc_len") = 0, py::arg("long_prob") = 0.3, py::arg("batch") = 0, R"doc(
Draws one batch exactly as `distca workload` does (docs/workloads.md): the same options
(dist: pretrain | prolong | fixed:N | uniform:A:B | file:PATH; layout: contiguous |
head-tail; max_doc_len 0 = no cap; long_prob: prolong's replacement probability) give the
same batch bit for bit. batch=b is batch b of `--batches` (random stream b of the seed).
Bad options raise ValueError with the CLI's message (which names the flag, e.g. --ranks).
)doc");
}

}  // namespace distca::python
