// The plan validator (validate.h). It deliberately re-derives everything from the batch's
// pieces and the plan's task lists with its own simple code (no DocumentIndex, no
// compute_traffic), so a bug in the builder or the accounting cannot hide itself.
//
// Every check is linear in pieces, tasks, ranks and blocks: documents get slots (ascending id)
// and their pieces and tasks are grouped by slot with a counting sort, scratch arrays are
// sized once per plan, and messages are built only on failure. `distca plan` checks every
// plan it reports, so the check costs a fraction of the planning rather than most of the run.
#include "distca/plan/validate.h"

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "distca/cost/analytic.h"
#include "distca/plan/traffic.h"

namespace distca {
namespace {

using std::to_string;

Status bad(const std::string& msg) { return Status::corrupt("plan: " + msg); }

std::string task_name(int64_t s, size_t i) {
  return "server " + to_string(s) + " task " + to_string(i);
}

// A held piece with its local position: rows [begin, end) of doc at local row `local`.
struct Held {
  int64_t doc, begin, end, rank, local;
};

// All pieces of a batch with their local rows, rank by rank in buffer order: rank r's are
// all[first[r] .. first[r + 1]).
struct HeldPieces {
  std::vector<Held> all;
  std::vector<size_t> first;  // [ranks + 1]
  std::span<const Held> of_rank(size_t r) const { return {all.data() + first[r], all.data() + first[r + 1]}; }
};

HeldPieces held_pieces(const Batch& b) {
  HeldPieces out;
  out.first.reserve(b.per_rank.size() + 1);
  out.first.push_back(0);
  for (const auto& rank : b.per_rank) out.first.push_back(out.first.back() + rank.size());
  out.all.reserve(out.first.back());
  for (size_t r = 0; r < b.per_rank.size(); ++r) {
    int64_t local = 0;
    for (const Piece& p : b.per_rank[r]) {
      out.all.push_back({p.doc, p.offset, p.offset + p.len, static_cast<int64_t>(r), local});
      local += p.len;
    }
  }
  return out;
}

// Stable counting sort of the indices 0 .. n - 1 by key(i) in [0, keys): the indices of key k
// are out[first[k] .. first[k + 1]), ascending.
template <class Key>
void group_indices(size_t n, size_t keys, Key key, std::vector<uint32_t>& out, std::vector<size_t>& first) {
  DISTCA_CHECK(n < (size_t{1} << 32));
  first.assign(keys + 1, 0);
  for (size_t i = 0; i < n; ++i) ++first[key(i) + 1];
  for (size_t k = 0; k < keys; ++k) first[k + 1] += first[k];
  std::vector<size_t> at(first.begin(), first.end() - 1);
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[at[key(i)]++] = static_cast<uint32_t>(i);
}

// (id, length) of every document of a valid batch, ascending id: a table by id when the ids
// are compact (the generator numbers documents 0, 1, ...), a sort otherwise.
std::vector<std::pair<int64_t, int64_t>> doc_lengths(const Batch& b) {
  size_t pieces = 0;
  int64_t hi = -1;
  for (const auto& rank : b.per_rank) {
    pieces += rank.size();
    for (const Piece& p : rank) hi = std::max(hi, p.doc);
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  if (hi < static_cast<int64_t>(2 * pieces + 1024)) {
    std::vector<int64_t> len(static_cast<size_t>(hi + 1), 0);  // 0: absent (lengths are > 0)
    for (const auto& rank : b.per_rank) for (const Piece& p : rank) len[static_cast<size_t>(p.doc)] = p.doc_len;
    for (size_t id = 0; id < len.size(); ++id) {
      if (len[id] > 0) out.emplace_back(static_cast<int64_t>(id), len[id]);
    }
    return out;
  }
  out.reserve(pieces);
  for (const auto& rank : b.per_rank) for (const Piece& p : rank) out.emplace_back(p.doc, p.doc_len);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The documents of a valid batch by slot (ascending id) and each one's pieces, ascending
// begin (they tile the document, Batch::validate).
struct Docs {
  std::vector<std::pair<int64_t, int64_t>> lengths;  // [slot] (id, length)
  std::vector<int32_t> slot_of;                      // [id] slot or -1; empty: search lengths
  const Held* held = nullptr;                        // HeldPieces::all
  std::vector<uint32_t> pieces;                      // indices into held, by slot, ascending begin
  std::vector<size_t> first;                         // [slot + 1] into pieces

  size_t size() const { return lengths.size(); }
  int64_t id(size_t slot) const { return lengths[slot].first; }
  int64_t len(size_t slot) const { return lengths[slot].second; }
  // -1 for a document the batch does not hold.
  int64_t slot(int64_t doc) const {
    if (!slot_of.empty()) {
      return doc >= 0 && doc < static_cast<int64_t>(slot_of.size()) ? slot_of[static_cast<size_t>(doc)] : -1;
    }
    auto it = std::lower_bound(lengths.begin(), lengths.end(), doc,
                               [](const std::pair<int64_t, int64_t>& e, int64_t d) { return e.first < d; });
    return it != lengths.end() && it->first == doc ? it - lengths.begin() : -1;
  }
  // The pieces of document `slot` (indices into held), ascending begin.
  std::span<const uint32_t> pieces_of(size_t slot) const {
    return {pieces.data() + first[slot], pieces.data() + first[slot + 1]};
  }
  // The piece holding row `row` of the document (0 <= row < its length).
  const Held& piece_at(size_t slot, int64_t row) const {
    const auto ps = pieces_of(slot);
    auto it = std::upper_bound(ps.begin(), ps.end(), row, [this](int64_t x, uint32_t i) { return x < held[i].begin; });
    return held[*(it - 1)];
  }
};

// `held` must outlive the result.
Docs index_docs(const Batch& b, const HeldPieces& held) {
  Docs d;
  d.lengths = doc_lengths(b);
  d.held = held.all.data();
  const int64_t hi = d.lengths.empty() ? -1 : d.lengths.back().first;
  if (hi < static_cast<int64_t>(2 * held.all.size() + 1024)) {
    d.slot_of.assign(static_cast<size_t>(hi + 1), -1);
    for (size_t s = 0; s < d.size(); ++s) d.slot_of[static_cast<size_t>(d.id(s))] = static_cast<int32_t>(s);
  }
  group_indices(held.all.size(), d.size(), [&](size_t i) { return static_cast<size_t>(d.slot(held.all[i].doc)); },
                d.pieces, d.first);
  for (size_t s = 0; s < d.size(); ++s) {
    std::sort(d.pieces.begin() + static_cast<std::ptrdiff_t>(d.first[s]),
              d.pieces.begin() + static_cast<std::ptrdiff_t>(d.first[s + 1]),
              [&](uint32_t x, uint32_t y) { return d.held[x].begin < d.held[y].begin; });
  }
  return d;
}

// Identity of a range of buffer rows: (doc, first position, count) runs.
struct IdRun {
  int64_t doc, pos, len;
};

// A buffer as (start, block) pairs: the receive buffer of an exchange, or a token buffer.
using Buffer = std::vector<std::pair<int64_t, RowBlock>>;

// Rows [off, off + len) of a buffer made of `blocks` (with their buffer starts) as runs of
// document positions; false if the range leaves the buffer.
bool identify(const Buffer& blocks, int64_t off, int64_t len, std::vector<IdRun>& out) {
  out.clear();
  if (off < 0 || len < 0) return false;
  auto it = std::upper_bound(blocks.begin(), blocks.end(), off,
                             [](int64_t o, const auto& b) { return o < b.first; });
  if (it == blocks.begin()) return len == 0;
  --it;
  while (len > 0) {
    if (it == blocks.end()) return false;
    const int64_t in = off - it->first;
    if (in < 0 || in >= it->second.rows()) return false;
    const int64_t take = std::min(len, it->second.rows() - in);
    out.push_back({it->second.doc, it->second.begin + in, take});
    off += take;
    len -= take;
    ++it;
  }
  return true;
}

// True when the runs are rows [pos, pos + total) of doc in order.
bool is_rows(const std::vector<IdRun>& runs, int64_t doc, int64_t pos) {
  for (const IdRun& r : runs) {
    if (r.doc != doc || r.pos != pos) return false;
    pos += r.len;
  }
  return true;
}

void recv_buffer(const Exchange& e, Buffer& out) {
  out.clear();
  int64_t at = 0;
  for (const auto& [peer, blocks] : e.recv_blocks.entries()) {
    for (const RowBlock& b : blocks) {
      out.emplace_back(at, b);
      at += b.rows();
    }
  }
}

void token_buffer(std::span<const Held> pieces, Buffer& out) {
  out.clear();
  for (const Held& h : pieces) out.emplace_back(h.local, RowBlock{h.doc, h.begin, h.end});
}

std::string exchange_ctx(int64_t r, const char* name) { return "rank " + to_string(r) + " exchange " + name; }

// One direction of an exchange (sparse, plan.h): counts equal the rows of the blocks for
// every peer either names, displacements are the prefix sums where rows move (0 elsewhere),
// and nothing goes to the rank itself.
Status check_direction(const PeerVector<int64_t>& counts, const PeerVector<int64_t>& displs,
                       const PeerVector<std::vector<RowBlock>>& blocks, int64_t self, const char* name) {
  auto rows_of = [](const std::vector<RowBlock>& list) {
    int64_t n = 0;
    for (const RowBlock& b : list) n += b.rows();
    return n;
  };
  auto fail = [&](size_t p, const char* what) {
    return bad(exchange_ctx(self, name) + " peer " + to_string(p) + ": " + what);
  };
  int64_t at = 0;
  for (const auto& [p, list] : blocks.entries()) {
    const int64_t rows = rows_of(list);
    if (rows != counts[p]) return fail(p, "counts differ from the row lists");
    if (rows > 0 && displs[p] != at) return fail(p, "displacements are not prefix sums");
    if (static_cast<int64_t>(p) == self && rows != 0) return fail(p, "a rank sends to itself");
    at += rows;
  }
  for (const auto& [p, c] : counts.entries()) {
    if (c != rows_of(blocks[p])) return fail(p, "counts differ from the row lists");
  }
  for (const auto& [p, d] : displs.entries()) {
    if (counts[p] == 0 && d != 0) return fail(p, "displacements are not prefix sums");
  }
  return Status::ok_status();
}

Status check_exchange_shape(const Exchange& e, int64_t r, int64_t R, const char* name,
                            int64_t row_bytes) {
  const auto n = static_cast<size_t>(R);
  if (e.send_counts.size() != n || e.send_displs.size() != n || e.recv_counts.size() != n ||
      e.recv_displs.size() != n || e.send_blocks.size() != n || e.recv_blocks.size() != n) {
    return bad(exchange_ctx(r, name) + ": vectors are not [ranks]");
  }
  if (e.row_bytes != row_bytes) return bad(exchange_ctx(r, name) + ": row_bytes " + to_string(e.row_bytes) +
                                           ", expected " + to_string(row_bytes));
  DISTCA_RETURN_IF_ERROR(check_direction(e.send_counts, e.send_displs, e.send_blocks, r, name));
  return check_direction(e.recv_counts, e.recv_displs, e.recv_blocks, r, name);
}

// What the steps below share: the batch's pieces by rank and by document, its documents.
struct Context {
  Context(const Plan& p, const Batch& in, const AttentionCostModel* c) : plan(p), input(in), cost(c) {}
  const Plan& plan;
  const Batch& input;
  const AttentionCostModel* cost;
  int64_t R = 0;
  HeldPieces held;                      // pieces by rank, in buffer order
  Docs docs;                            // the plan batch's documents and their pieces

  const Exchange& ex(int64_t r, ExchangeKind k) const {
    return plan.ranks[static_cast<size_t>(r)].exchanges[static_cast<size_t>(k)];
  }
};

// --- batch: valid, the input's documents, equal to the input except for wlb.
Status check_batch(Context& c) {
  const Plan& plan = c.plan;
  const Batch& input = c.input;
  const Batch& batch = plan.batch;
  DISTCA_RETURN_IF_ERROR(input.validate().with_context("plan: input batch"));
  // A batch equal to the valid input is valid and holds the input's documents.
  const bool same = batch == input;
  if (!same) DISTCA_RETURN_IF_ERROR(batch.validate().with_context("plan: plan batch"));
  c.R = batch.ranks;
  if (c.R != input.ranks) return bad("plan batch has " + to_string(c.R) + " ranks, input " + to_string(input.ranks));
  c.held = held_pieces(batch);
  c.docs = index_docs(batch, c.held);
  if (!same && c.docs.lengths != doc_lengths(input)) return bad("plan batch's documents differ from the input's");
  if (plan.scheduler.kind != SchedulerKind::kWlb && !same) {
    return bad("plan batch differs from the input batch (only wlb re-packs)");
  }
  if (static_cast<int64_t>(plan.servers.size()) != c.R || static_cast<int64_t>(plan.ranks.size()) != c.R) {
    return bad("servers/ranks are not [ranks]");
  }
  return Status::ok_status();
}

// Query rows [a, b) of the document in `slot`, as one task covers them.
struct Covered {
  size_t slot;
  int64_t a, b;
};

// --- tasks and cu_seqlens; collects every task's query rows for the coverage check.
Status check_tasks(const Context& c, std::vector<Covered>& covered, int64_t& task_work) {
  for (int64_t s = 0; s < c.R; ++s) {
    const ServerPlan& sp = c.plan.servers[static_cast<size_t>(s)];
    const size_t nt = sp.tasks.size();
    if (sp.cu_seqlens_q.size() != nt + 1 || sp.cu_seqlens_k.size() != nt + 1 ||
        sp.cu_seqlens_q[0] != 0 || sp.cu_seqlens_k[0] != 0) {
      return bad("server " + to_string(s) + ": cu_seqlens must have tasks + 1 entries starting at 0");
    }
    for (size_t i = 0; i < nt; ++i) {
      const TaskPlacement& t = sp.tasks[i].task;
      if (t.server != s) return bad(task_name(s, i) + ": names server " + to_string(t.server));
      const int64_t slot = c.docs.slot(t.doc);
      if (slot < 0) return bad(task_name(s, i) + ": unknown document " + to_string(t.doc));
      if (t.q_begin < 0 || t.q_begin >= t.q_end || t.q_end > c.docs.len(static_cast<size_t>(slot))) {
        return bad(task_name(s, i) + ": query rows [" + to_string(t.q_begin) + ", " + to_string(t.q_end) +
                   ") outside document " + to_string(t.doc) + " or empty");
      }
      if (t.home < 0 || t.home >= c.R) return bad(task_name(s, i) + ": home out of range");
      // The pieces tile the document, so only the one holding q_begin can hold the rows.
      const Held& h = c.docs.piece_at(static_cast<size_t>(slot), t.q_begin);
      if (h.rank != t.home || t.q_end > h.end) {
        return bad(task_name(s, i) + ": query rows not inside one piece held by home " + to_string(t.home));
      }
      if (sp.cu_seqlens_q[i + 1] - sp.cu_seqlens_q[i] != t.q_end - t.q_begin ||
          sp.cu_seqlens_k[i + 1] - sp.cu_seqlens_k[i] != t.q_end) {
        return bad(task_name(s, i) + ": cu_seqlens disagree with the task's q_len / kv_len");
      }
      covered.push_back({static_cast<size_t>(slot), t.q_begin, t.q_end});
      task_work += causal_pairs(t.q_begin, t.q_end);
    }
  }
  return Status::ok_status();
}

// --- coverage (every document's query rows exactly once) and work conservation.
Status check_coverage(const Context& c, const std::vector<Covered>& covered, int64_t task_work) {
  std::vector<uint32_t> by_doc;  // indices into covered
  std::vector<size_t> first;
  group_indices(covered.size(), c.docs.size(), [&](size_t i) { return covered[i].slot; }, by_doc, first);
  auto before = [&](uint32_t x, uint32_t y) {
    return covered[x].a != covered[y].a ? covered[x].a < covered[y].a : covered[x].b < covered[y].b;
  };
  int64_t doc_work = 0;
  for (size_t slot = 0; slot < c.docs.size(); ++slot) {
    const int64_t id = c.docs.id(slot), len = c.docs.len(slot);
    doc_work += document_pairs(len);
    auto b = by_doc.begin() + static_cast<std::ptrdiff_t>(first[slot]);
    auto e = by_doc.begin() + static_cast<std::ptrdiff_t>(first[slot + 1]);
    std::sort(b, e, before);
    int64_t at = 0;
    for (auto it = b; it != e; ++it) {
      const int64_t a = covered[*it].a;
      if (a != at) {
        return bad("document " + to_string(id) + ": query rows " +
                   (a < at ? "[" + to_string(a) + ", " + to_string(std::min(at, covered[*it].b)) + ") covered twice"
                           : "[" + to_string(at) + ", " + to_string(a) + ") not covered"));
      }
      at = covered[*it].b;
    }
    if (at != len) return bad("document " + to_string(id) + ": query rows [" + to_string(at) + ", " +
                              to_string(len) + ") not covered");
  }
  if (task_work != doc_work) {
    return bad("work not conserved: tasks " + to_string(task_work) + " pairs, documents " + to_string(doc_work));
  }
  return Status::ok_status();
}

// --- layouts: tokens, each exchange's shape, sender and receiver agreeing on every pair.
Status check_layouts(const Context& c) {
  const RowBytes& rb = c.plan.row_bytes;
  const int64_t kRowBytes[kNumExchanges] = {rb.q, rb.kv, rb.o + rb.lse, rb.o, rb.q, rb.kv};
  for (int64_t r = 0; r < c.R; ++r) {
    const RankPlan& rp = c.plan.ranks[static_cast<size_t>(r)];
    if (rp.tokens != c.plan.batch.rank_tokens(r)) return bad("rank " + to_string(r) + ": tokens differ from the batch");
    for (int k = 0; k < kNumExchanges; ++k) {
      DISTCA_RETURN_IF_ERROR(check_exchange_shape(rp.exchanges[static_cast<size_t>(k)], r, c.R,
                                                  exchange_name(static_cast<ExchangeKind>(k)), kRowBytes[k]));
    }
  }
  // Only the pairs either side names can disagree (every other pair is empty on both ends).
  auto mismatch = [](ExchangeKind kind, int64_t from, int64_t to) {
    return bad("exchange " + std::string(exchange_name(kind)) + ": rank " + to_string(from) +
               " sends to rank " + to_string(to) + " rows that rank does not expect");
  };
  for (int64_t a = 0; a < c.R; ++a) {
    for (int k = 0; k < kNumExchanges; ++k) {
      const auto kind = static_cast<ExchangeKind>(k);
      const auto ua = static_cast<size_t>(a);
      for (const auto& [b, blocks] : c.ex(a, kind).send_blocks.entries()) {
        if (blocks != c.ex(static_cast<int64_t>(b), kind).recv_blocks[ua]) return mismatch(kind, a, static_cast<int64_t>(b));
      }
      for (const auto& [b, blocks] : c.ex(a, kind).recv_blocks.entries()) {
        if (blocks != c.ex(static_cast<int64_t>(b), kind).send_blocks[ua]) return mismatch(kind, static_cast<int64_t>(b), a);
      }
    }
  }
  return Status::ok_status();
}

// A block and the peer whose list it belongs in; `seq` keeps a peer's blocks in the order
// they were made.
struct PeerBlock {
  size_t peer;
  size_t seq;
  RowBlock block;
};

// Sorts `blocks` by (peer, seq), so they list every peer's blocks in order, peers ascending.
void sort_by_peer(std::vector<PeerBlock>& blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const PeerBlock& a, const PeerBlock& b) { return a.peer != b.peer ? a.peer < b.peer : a.seq < b.seq; });
}

// True when `lists` (peers ascending, PeerVector's order) holds exactly `want` (sorted by
// sort_by_peer): the same blocks for every peer, a peer's empty list the same as none.
bool same_lists(const PeerVector<std::vector<RowBlock>>& lists, const std::vector<PeerBlock>& want) {
  size_t i = 0;
  for (const auto& [p, list] : lists.entries()) {
    for (const RowBlock& b : list) {
      if (i == want.size() || want[i].peer != p || want[i].block != b) return false;
      ++i;
    }
  }
  return i == want.size();
}

// --- canonical lists rebuilt from the tasks (plan.h), and the mirrors.
Status check_canonical(const Context& c) {
  std::vector<int64_t> need(c.docs.size(), 0);  // [slot] E of the server's tasks, 0 between servers
  std::vector<size_t> order;                     // slots in order of their first task
  std::vector<PeerBlock> q, kv;
  for (int64_t s = 0; s < c.R; ++s) {
    const ServerPlan& sp = c.plan.servers[static_cast<size_t>(s)];
    q.clear();
    kv.clear();
    for (const ServerTask& st : sp.tasks) {
      const TaskPlacement& t = st.task;
      if (t.home != s) q.push_back({static_cast<size_t>(t.home), q.size(), {t.doc, t.q_begin, t.q_end}});
      const auto slot = static_cast<size_t>(c.docs.slot(t.doc));
      if (need[slot] == 0) order.push_back(slot);
      need[slot] = std::max(need[slot], t.q_end);
    }
    for (size_t slot : order) {
      const int64_t e = need[slot];
      for (const uint32_t i : c.docs.pieces_of(slot)) {
        const Held& h = c.docs.held[i];
        if (h.begin < e && h.rank != s) kv.push_back({static_cast<size_t>(h.rank), kv.size(), {h.doc, h.begin, std::min(h.end, e)}});
      }
      need[slot] = 0;
    }
    order.clear();
    sort_by_peer(q);
    sort_by_peer(kv);
    if (!same_lists(c.ex(s, ExchangeKind::kQ).recv_blocks, q)) return bad("server " + to_string(s) + ": q receive rows are not the canonical ones");
    if (!same_lists(c.ex(s, ExchangeKind::kKv).recv_blocks, kv)) return bad("server " + to_string(s) + ": kv receive rows are not the canonical ones");
    if (!same_lists(c.ex(s, ExchangeKind::kOLse).send_blocks, q) || !same_lists(c.ex(s, ExchangeKind::kDO).recv_blocks, q) ||
        !same_lists(c.ex(s, ExchangeKind::kDQ).send_blocks, q)) {
      return bad("server " + to_string(s) + ": o_lse/do/dq rows do not mirror the q rows");
    }
    if (!same_lists(c.ex(s, ExchangeKind::kDKv).send_blocks, kv)) return bad("server " + to_string(s) + ": dkv rows do not mirror the kv rows");
  }
  return Status::ok_status();
}

// --- task inputs: q_offset and every kv segment address the task's document rows.
Status check_task_inputs(const Context& c) {
  std::vector<IdRun> ids;
  Buffer qbuf, kvbuf, local;
  for (int64_t s = 0; s < c.R; ++s) {
    const ServerPlan& sp = c.plan.servers[static_cast<size_t>(s)];
    recv_buffer(c.ex(s, ExchangeKind::kQ), qbuf);
    recv_buffer(c.ex(s, ExchangeKind::kKv), kvbuf);
    token_buffer(c.held.of_rank(static_cast<size_t>(s)), local);
    for (size_t i = 0; i < sp.tasks.size(); ++i) {
      const ServerTask& st = sp.tasks[i];
      const TaskPlacement& t = st.task;
      const Buffer& qsrc = t.home == s ? local : qbuf;
      if (!identify(qsrc, st.q_offset, t.q_end - t.q_begin, ids) || !is_rows(ids, t.doc, t.q_begin)) {
        return bad(task_name(s, i) + ": q_offset does not address the task's query rows");
      }
      int64_t pos = 0;
      for (const Segment& seg : st.kv) {
        if (seg.len <= 0 || !identify(seg.received ? kvbuf : local, seg.offset, seg.len, ids) ||
            !is_rows(ids, t.doc, pos)) {
          return bad(task_name(s, i) + ": kv segment at context row " + to_string(pos) +
                     " does not address the document's rows");
        }
        pos += seg.len;
      }
      if (pos != t.q_end) return bad(task_name(s, i) + ": kv segments hold " + to_string(pos) +
                                     " rows, the context has " + to_string(t.q_end));
    }
  }
  return Status::ok_status();
}
// --- figures: loads (after and colocated) and tokens.
Status check_loads(const Context& c) {
  const PlanMetrics& m = c.plan.metrics;
  const auto n = static_cast<size_t>(c.R);
  std::vector<double> loads(n, 0.0), before(n, 0.0);
  for (int64_t s = 0; s < c.R; ++s) {
    for (const ServerTask& st : c.plan.servers[static_cast<size_t>(s)].tasks) {
      loads[static_cast<size_t>(s)] += task_cost(c.cost, st.task.q_end - st.task.q_begin, st.task.q_end);
    }
    if (c.plan.servers[static_cast<size_t>(s)].load != loads[static_cast<size_t>(s)]) {
      return bad("server " + to_string(s) + ": load differs from its tasks' costs");
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Piece& p : c.input.per_rank[r]) before[r] += task_cost(c.cost, p.len, p.offset + p.len);
  }
  if (m.loads != loads || m.load_max_over_mean != max_over_mean(loads)) return bad("metrics: loads differ from a recount");
  if (m.loads_before != before || m.load_before_max_over_mean != max_over_mean(before)) {
    return bad("metrics: colocated loads differ from a recount");
  }
  std::vector<double> tok;
  for (int64_t r = 0; r < c.R; ++r) tok.push_back(static_cast<double>(c.plan.batch.rank_tokens(r)));
  if (m.tokens.size() != n || m.tokens_max_over_mean != max_over_mean(tok)) return bad("metrics: tokens differ from the batch");
  return Status::ok_status();
}

// --- figures: the exchanges' traffic, from the layouts (rows sent times row bytes).
Status check_traffic(const Context& c) {
  Traffic t;
  t.per_rank.assign(static_cast<size_t>(c.R), {});
  int64_t* kind_total[kNumExchanges] = {&t.bytes.q, &t.bytes.kv, &t.bytes.o_lse, &t.bytes.d_o, &t.bytes.dq, &t.bytes.dkv};
  for (int64_t r = 0; r < c.R; ++r) {
    for (int k = 0; k < kNumExchanges; ++k) {
      const Exchange& e = c.ex(r, static_cast<ExchangeKind>(k));
      const int64_t sent = e.send_rows() * e.row_bytes, recv = e.recv_rows() * e.row_bytes;
      *kind_total[k] += sent;
      auto& pr = t.per_rank[static_cast<size_t>(r)];
      (k < 3 ? pr.fwd_sent : pr.bwd_sent) += sent;
      (k < 3 ? pr.fwd_recv : pr.bwd_recv) += recv;
    }
  }
  if (!(t == c.plan.metrics.traffic)) return bad("metrics: traffic differs from the bytes of the layouts");
  return Status::ok_status();
}

// --- figures: percp's all-gather, recounted from the pieces (zero for other schedulers).
Result<AllGatherTraffic> check_allgather(const Context& c) {
  AllGatherTraffic ag;
  ag.per_rank.assign(static_cast<size_t>(c.R), {});
  if (c.plan.scheduler.kind == SchedulerKind::kPerCp) {
    const int64_t C = c.plan.scheduler.cp_degree;
    if (C < 1 || c.R % C != 0) return bad("percp: CP degree does not divide the ranks");
    // A document's serving ranks: every rank of every group holding one of its rows.
    std::vector<int64_t> groups;      // by slot, ascending within a slot
    std::vector<size_t> first{0};     // [slot + 1] into groups
    for (size_t slot = 0; slot < c.docs.size(); ++slot) {
      const auto from = static_cast<std::ptrdiff_t>(groups.size());
      for (const uint32_t i : c.docs.pieces_of(slot)) groups.push_back(c.docs.held[i].rank / C);
      std::sort(groups.begin() + from, groups.end());
      groups.erase(std::unique(groups.begin() + from, groups.end()), groups.end());
      first.push_back(groups.size());
    }
    const int64_t kv = c.plan.row_bytes.kv;
    for (const Held& h : c.held.all) {
      const auto slot = static_cast<size_t>(c.docs.slot(h.doc));
      for (size_t g = first[slot]; g < first[slot + 1]; ++g) {
        for (int64_t r = groups[g] * C; r < (groups[g] + 1) * C; ++r) {
          if (r == h.rank) continue;
          const int64_t bytes = (h.end - h.begin) * kv;
          ag.bytes += bytes;
          ag.per_rank[static_cast<size_t>(h.rank)].fwd_sent += bytes;
          ag.per_rank[static_cast<size_t>(r)].fwd_recv += bytes;
          ag.per_rank[static_cast<size_t>(r)].bwd_sent += bytes;
          ag.per_rank[static_cast<size_t>(h.rank)].bwd_recv += bytes;
        }
      }
    }
  }
  if (!(ag == c.plan.metrics.allgather)) return bad("metrics: all-gather bytes differ from a recount");
  return ag;
}

// --- figures: the reported per-rank bytes and comm_bytes_* (percp: the all-gather alone;
// every other scheduler: its exchanges).
Status check_reported(const Context& c, const AllGatherTraffic& ag) {
  const PlanMetrics& m = c.plan.metrics;
  std::vector<RankBytes> reported(static_cast<size_t>(c.R));
  int64_t fwd = 0, bwd = 0, mx = 0;
  const bool percp = c.plan.scheduler.kind == SchedulerKind::kPerCp;
  for (int64_t r = 0; r < c.R; ++r) {
    const auto u = static_cast<size_t>(r);
    auto rows_bytes = [&](ExchangeKind k, bool send) {
      const Exchange& e = c.ex(r, k);
      return (send ? e.send_rows() : e.recv_rows()) * e.row_bytes;
    };
    RankBytes& x = reported[u];
    if (percp) {
      x = ag.per_rank[u];
    } else {
      for (ExchangeKind k : {ExchangeKind::kQ, ExchangeKind::kKv, ExchangeKind::kOLse}) {
        x.fwd_sent += rows_bytes(k, true);
        x.fwd_recv += rows_bytes(k, false);
      }
      for (ExchangeKind k : {ExchangeKind::kDO, ExchangeKind::kDQ, ExchangeKind::kDKv}) {
        x.bwd_sent += rows_bytes(k, true);
        x.bwd_recv += rows_bytes(k, false);
      }
    }
    fwd += x.fwd_sent;
    bwd += x.bwd_sent;
    mx = std::max(mx, x.fwd());
  }
  if (reported != m.per_rank) return bad("metrics: per-rank bytes differ from a recount");
  if (fwd != m.comm_bytes_total) return bad("metrics: comm_bytes_total " + to_string(m.comm_bytes_total) + ", recount " + to_string(fwd));
  if (bwd != m.comm_bytes_backward) return bad("metrics: comm_bytes_backward " + to_string(m.comm_bytes_backward) + ", recount " + to_string(bwd));
  if (mx != m.comm_bytes_max_rank) return bad("metrics: comm_bytes_max_rank " + to_string(m.comm_bytes_max_rank) + ", recount " + to_string(mx));
  if (!c.plan.hosts.empty() && static_cast<int64_t>(c.plan.hosts.size()) != c.R) return bad("hosts: one per rank expected");
  const HostBytes hb = host_bytes(c.plan, c.plan.hosts);
  const TrafficBreakdown& t = m.traffic.bytes;
  if (!(hb == m.host_bytes) || hb.intra_fwd + hb.inter_fwd != t.forward() || hb.intra_bwd + hb.inter_bwd != t.backward()) {
    return bad("metrics: bytes by host differ from a recount");
  }
  return Status::ok_status();
}

}  // namespace

Status validate_plan(const Plan& plan, const Batch& input, const AttentionCostModel* cost) {
  Context c(plan, input, cost);
  DISTCA_RETURN_IF_ERROR(check_batch(c));
  std::vector<Covered> covered;
  covered.reserve(static_cast<size_t>(plan.num_tasks()));
  int64_t task_work = 0;
  DISTCA_RETURN_IF_ERROR(check_tasks(c, covered, task_work));
  DISTCA_RETURN_IF_ERROR(check_coverage(c, covered, task_work));
  DISTCA_RETURN_IF_ERROR(check_layouts(c));
  DISTCA_RETURN_IF_ERROR(check_canonical(c));
  DISTCA_RETURN_IF_ERROR(check_task_inputs(c));
  DISTCA_RETURN_IF_ERROR(check_loads(c));
  DISTCA_RETURN_IF_ERROR(check_traffic(c));
  DISTCA_ASSIGN_OR_RETURN(AllGatherTraffic ag, check_allgather(c));
  return check_reported(c, ag);
}

namespace {

// The pool's own bookkeeping against its batch: the rank maps invert each other and are
// stage-major, every member sits on its stage, and every piece on a rank belongs to the
// member of that rank's stage (so idle stages' ranks hold nothing).
Status check_pool(const PooledBatch& pool) {
  const int64_t pp = pool.pp, dp = pool.dp;
  if (pp < 1 || dp < 1) return bad("pool: pp " + to_string(pp) + " and dp " + to_string(dp) + " must be >= 1");
  const int64_t units = pp * dp;
  const int64_t R = pool.batch.ranks;
  if (static_cast<int64_t>(pool.unit_of.size()) != R || static_cast<int64_t>(pool.rank_of_unit.size()) != units ||
      static_cast<int64_t>(pool.member_of_stage.size()) != pp) {
    return bad("pool: rank or stage maps have the wrong size");
  }
  std::vector<int64_t> stage_member(static_cast<size_t>(pp), -1);
  for (size_t i = 0; i < pool.members.size(); ++i) {
    const int64_t st = pool.members[i].stage;
    if (st < 0 || st >= pp || stage_member[static_cast<size_t>(st)] >= 0) {
      return bad("pool: member " + to_string(i) + " has stage " + to_string(st) + ", outside [0, pp) or taken");
    }
    stage_member[static_cast<size_t>(st)] = static_cast<int64_t>(i);
  }
  if (stage_member != pool.member_of_stage) return bad("pool: member_of_stage differs from the members' stages");
  int64_t prev = -1;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t u = pool.unit_of[static_cast<size_t>(r)];
    if (u <= prev || u >= units || pool.rank_of_unit[static_cast<size_t>(u)] != r) {
      return bad("pool: pooled rank " + to_string(r) + " maps to unit " + to_string(u) +
                 ", not ascending or not inverted by rank_of_unit");
    }
    prev = u;
  }
  int64_t mapped = 0;
  for (int64_t u = 0; u < units; ++u) {
    const int64_t r = pool.rank_of_unit[static_cast<size_t>(u)];
    if (r < 0) {
      if (stage_member[static_cast<size_t>(u / dp)] >= 0) {
        return bad("pool: rank " + to_string(u) + " of active stage " + to_string(u / dp) + " is not in the pool");
      }
      continue;
    }
    ++mapped;
  }
  if (mapped != R) return bad("pool: rank_of_unit maps " + to_string(mapped) + " ranks, the batch has " + to_string(R));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t st = pool.unit_of[static_cast<size_t>(r)] / dp;
    for (const Piece& p : pool.batch.per_rank[static_cast<size_t>(r)]) {
      if (p.doc < 0 || p.doc % pp != st || stage_member[static_cast<size_t>(st)] < 0) {
        return bad("pool: rank " + to_string(r) + " (stage " + to_string(st) + ") holds document " +
                   to_string(p.doc) + ", which is not its stage's member's");
      }
    }
  }
  return Status::ok_status();
}

}  // namespace

Status validate_pooled_plan(const Plan& plan, const PooledBatch& pool, const AttentionCostModel* cost) {
  DISTCA_RETURN_IF_ERROR(check_pool(pool));
  // Stages before the general checks, so a home moved to another stage is named as such
  // (validate_plan would report only that the home does not hold the rows).
  const int64_t pp = pool.pp, dp = pool.dp;
  for (size_t s = 0; s < plan.servers.size(); ++s) {
    const auto& tasks = plan.servers[s].tasks;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const TaskPlacement& t = tasks[i].task;
      if (t.doc < 0 || t.home < 0 || t.home >= pool.batch.ranks) continue;  // validate_plan names it
      const int64_t stage = t.doc % pp;
      const int64_t home_stage = pool.unit_of[static_cast<size_t>(t.home)] / dp;
      if (pool.member_of_stage[static_cast<size_t>(home_stage)] < 0) {
        return bad(task_name(static_cast<int64_t>(s), i) + ": home rank " + to_string(t.home) + " is on idle stage " +
                   to_string(home_stage));
      }
      if (home_stage != stage) {
        return bad(task_name(static_cast<int64_t>(s), i) + ": document " + to_string(t.doc) + " of stage " +
                   to_string(stage) + " has its home rank " + to_string(t.home) + " on stage " + to_string(home_stage));
      }
    }
  }
  return validate_plan(plan, pool.batch, cost);
}

Result<std::map<int64_t, std::vector<int32_t>>> brute_force_pair_counts(const Plan& plan) {
  std::map<int64_t, std::vector<int32_t>> counts;
  std::map<int64_t, int64_t> lens;
  for (const auto& rank : plan.batch.per_rank) {
    for (const Piece& p : rank) {
      lens[p.doc] = p.doc_len;
      counts[p.doc].assign(static_cast<size_t>(p.doc_len * p.doc_len), 0);
    }
  }
  const auto held = held_pieces(plan.batch);
  std::vector<IdRun> ids;
  // Row identity of one buffer row.
  auto row_of = [&](const Buffer& buf, int64_t row,
                    std::pair<int64_t, int64_t>& out) {
    if (!identify(buf, row, 1, ids) || ids.size() != 1) return false;
    out = {ids[0].doc, ids[0].pos};
    return true;
  };
  for (size_t s = 0; s < plan.servers.size(); ++s) {
    Buffer local, qbuf, kvbuf;
    token_buffer(held.of_rank(s), local);
    recv_buffer(plan.ranks[s].exchange(ExchangeKind::kQ), qbuf);
    recv_buffer(plan.ranks[s].exchange(ExchangeKind::kKv), kvbuf);
    const ServerPlan& sp = plan.servers[s];
    for (size_t i = 0; i < sp.tasks.size(); ++i) {
      const ServerTask& st = sp.tasks[i];
      const int64_t q_len = sp.cu_seqlens_q[i + 1] - sp.cu_seqlens_q[i];
      const int64_t kv_len = sp.cu_seqlens_k[i + 1] - sp.cu_seqlens_k[i];
      // The assembled K/V input of the task, row by row.
      std::vector<std::pair<int64_t, int64_t>> keys;
      for (const Segment& seg : st.kv) {
        for (int64_t j = 0; j < seg.len; ++j) {
          std::pair<int64_t, int64_t> id;
          if (!row_of(seg.received ? kvbuf : local, seg.offset + j, id)) {
            return Status::corrupt("brute force: server " + std::to_string(s) + " task " +
                                   std::to_string(i) + ": kv segment outside its buffer");
          }
          keys.push_back(id);
        }
      }
      if (static_cast<int64_t>(keys.size()) != kv_len) {
        return Status::corrupt("brute force: server " + std::to_string(s) + " task " +
                               std::to_string(i) + ": kv input has the wrong length");
      }
      const bool local_q = st.task.home == static_cast<int64_t>(s);
      for (int64_t r = 0; r < q_len; ++r) {
        std::pair<int64_t, int64_t> qid;
        if (!row_of(local_q ? local : qbuf, st.q_offset + r, qid)) {
          return Status::corrupt("brute force: server " + std::to_string(s) + " task " +
                                 std::to_string(i) + ": query row outside its buffer");
        }
        // Bottom-right causal: row r sees keys 0 .. kv_len - q_len + r.
        for (int64_t k = 0; k <= kv_len - q_len + r && k < kv_len; ++k) {
          if (keys[static_cast<size_t>(k)].first != qid.first) {
            return Status::corrupt("brute force: server " + std::to_string(s) + " task " +
                                   std::to_string(i) + ": a query meets a key of another document");
          }
          const int64_t L = lens.at(qid.first);
          ++counts[qid.first][static_cast<size_t>(qid.second * L + keys[static_cast<size_t>(k)].second)];
        }
      }
    }
  }
  return counts;
}

}  // namespace distca
