// Python bindings of the drafting core (module drafter_service.native._core).
// Arrays cross as flat NumPy arrays; long-running calls release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "drafter.h"
#include "input_trie.h"
#include "sub_index.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace drafter {
namespace {

template <typename T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<nb::numpy, T, nb::ndim<1>>;

// A binding's extra: the call runs without the GIL (after its arguments are converted,
// and before its result is), so that other Python threads keep running.
constexpr nb::call_guard<nb::gil_scoped_release> without_gil{};

// Returns f() run without the GIL, for a binding whose result becomes Python objects
// (which need the GIL) once f is done.
template <typename F>
auto released(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// Hands a vector to NumPy without copying.
template <typename T>
Out<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  size_t shape[1] = {heap->size()};
  return Out<T>(heap->data(), 1, shape, owner);
}

// Keeps a Python object (the arrays backing a wrapped sub-index) alive from C++; the
// last reference may drop on any thread, so it takes the GIL to release it (and leaves
// it once the interpreter is gone).
std::shared_ptr<const void> keep_alive(nb::object obj) {
  return std::shared_ptr<const void>(obj.release().ptr(), [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_DECREF(o);
  });
}

// One of a sub-index's arrays (SubIndex::tokens or suffix_array) as a read-only view
// that keeps `self` alive.
nb::ndarray<nb::numpy, const int32_t, nb::ndim<1>> view(nb::handle self,
                                                       const int32_t* (SubIndex::*array)() const) {
  const SubIndex& s = nb::cast<const SubIndex&>(self);
  size_t shape[1] = {static_cast<size_t>(s.num_tokens())};
  return {(s.*array)(), 1, shape, self};
}

// SubIndex and Datastore are bound as themselves (nanobind/stl/shared_ptr.h): one passed
// to C++ as a shared_ptr keeps its Python object alive, and nanobind's deleter takes the
// GIL, so its last reference may drop on any thread.

// Datastore(sub_indices, base_count): checked, then constructed in place.
void init_datastore(Datastore* self, const std::vector<std::shared_ptr<const SubIndex>>& subs,
                    int64_t base_count) {
  if (base_count < 0 || base_count > static_cast<int64_t>(subs.size())) {
    throw std::invalid_argument("base_count must be in [0, " + std::to_string(subs.size()) +
                                "], got " + std::to_string(base_count));
  }
  for (const auto& s : subs) {
    if (s == nullptr) throw std::invalid_argument("sub_indices must not contain None");
    if (s->vocab_size() != subs[0]->vocab_size()) {
      throw std::invalid_argument("sub-indices disagree on vocab_size: " +
                                  std::to_string(s->vocab_size()) + " vs " +
                                  std::to_string(subs[0]->vocab_size()));
    }
  }
  new (self) Datastore{subs, static_cast<size_t>(base_count)};
}

// Builds a fresh input trie over `context` (when use_input) and drafts once.
auto draft_context(In<int32_t> context, const Datastore* datastore, const DraftConfig& config,
                   int32_t budget, bool use_input, int32_t vocab_size) {
  validate(config);
  check_budgets(&budget, 1, config);
  Draft draft = released([&] {
    const int32_t* ctx = context.data();
    const int64_t n = context.shape(0);
    check_tokens(ctx, n, vocab_size);
    std::unique_ptr<InputTrie> trie;
    if (use_input) {
      trie = std::make_unique<InputTrie>(config.input_max_depth);
      for (int64_t i = 0; i < n; ++i) trie->append(ctx[i]);
    }
    DraftScratch scratch;
    Draft out;
    draft_one(trie.get(), ctx, n, datastore, config, budget, scratch, out);
    return out;
  });
  return std::make_tuple(to_numpy(std::move(draft.tokens)), to_numpy(std::move(draft.parents)),
                         to_numpy(std::move(draft.scores)));
}

// Drafter::draft_batch: shapes checked, the GIL released while it runs, the drafts as
// (tokens, parents, scores, offsets) arrays and each request's state after the call.
auto batch_call(Drafter& d, In<int64_t> handles, In<int32_t> tokens, In<int64_t> offsets,
                In<int32_t> budgets) {
  const int64_t batch = handles.shape(0);
  if (offsets.shape(0) != handles.shape(0) + 1 || budgets.shape(0) != handles.shape(0)) {
    throw std::invalid_argument("for a batch of " + std::to_string(batch) +
                                " requests, offsets needs " + std::to_string(batch + 1) +
                                " entries (got " + std::to_string(offsets.shape(0)) +
                                ") and budgets " + std::to_string(batch) + " (got " +
                                std::to_string(budgets.shape(0)) + ")");
  }
  BatchDrafts out = released([&] {
    return d.draft_batch(handles.data(), batch, tokens.data(), tokens.shape(0), offsets.data(),
                         budgets.data());
  });
  return std::make_tuple(to_numpy(std::move(out.tokens)), to_numpy(std::move(out.parents)),
                         to_numpy(std::move(out.scores)), to_numpy(std::move(out.offsets)),
                         to_numpy(std::move(out.state_bytes)),
                         to_numpy(std::move(out.state_headroom)));
}

// retrieve_datastore: the datastore's candidate tree for one context.
auto retrieve_tree(const Datastore& datastore, In<int32_t> context, const DraftConfig& config,
                   int32_t max_len) {
  validate(config);
  RetrievalScratch scratch;
  CandidateTree tree;
  retrieve_sub_indices(datastore, 0, datastore.sub_indices.size(), context.data(),
                       context.shape(0), config, max_len, scratch, tree);
  // Flatten as (token, parent, count) rows in node-creation order; row 0 is the root.
  // A node is made when its parent's children are listed, before its own row.
  std::vector<int32_t> tokens(tree.num_nodes()), parents(tree.num_nodes(), -1);
  std::vector<int64_t> counts(tree.num_nodes());
  for (int32_t n = 0; n < tree.num_nodes(); ++n) {
    tokens[n] = tree.token(n);
    counts[n] = tree.count(n);
    for (int32_t c = tree.first_child(n); c != -1; c = tree.next_sibling(c)) parents[c] = n;
  }
  return std::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(parents)),
                         to_numpy(std::move(counts)));
}

// The module's functions: SA-IS over a token array (without the GIL), and drafting
// without a Drafter (one retrieval, one draft).
void bind_functions(nb::module_& m) {
  m.def(
      "build_suffix_array",
      [](In<int32_t> tokens, int32_t vocab_size) {
        return to_numpy(released(
            [&] { return build_suffix_array(tokens.data(), tokens.shape(0), vocab_size); }));
      },
      "tokens"_a, "vocab_size"_a);
  m.def("retrieve_datastore", &retrieve_tree, "datastore"_a, "context"_a, "config"_a,
        "max_len"_a);
  m.def("draft_context", &draft_context, "context"_a, "datastore"_a.none(), "config"_a,
        "budget"_a, "use_input"_a, "vocab_size"_a);
}

// DraftConfig: every knob, read-write, and its validation.
void bind_config(nb::module_& m) {
  nb::class_<DraftConfig>(m, "DraftConfig")
      .def(nb::init<>())
      .def_rw("input_max_prefix", &DraftConfig::input_max_prefix)
      .def_rw("input_max_depth", &DraftConfig::input_max_depth)
      .def_rw("datastore_max_prefix", &DraftConfig::datastore_max_prefix)
      .def_rw("datastore_min_prefix", &DraftConfig::datastore_min_prefix)
      .def_rw("datastore_samples", &DraftConfig::datastore_samples)
      .def_rw("datastore_max_continuation", &DraftConfig::datastore_max_continuation)
      .def_rw("datastore_min_tree_nodes", &DraftConfig::datastore_min_tree_nodes)
      .def_rw("input_weight", &DraftConfig::input_weight)
      .def_rw("input_child_discount_base", &DraftConfig::input_child_discount_base)
      .def_rw("input_child_discount_per_match", &DraftConfig::input_child_discount_per_match)
      .def_rw("datastore_weight", &DraftConfig::datastore_weight)
      .def_rw("datastore_child_discount", &DraftConfig::datastore_child_discount)
      .def_rw("max_budget", &DraftConfig::max_budget)
      .def_rw("recent_samples", &DraftConfig::recent_samples)
      .def_rw("recent_min_match", &DraftConfig::recent_min_match)
      .def_rw("recent_max_match", &DraftConfig::recent_max_match)
      .def_rw("recent_candidates", &DraftConfig::recent_candidates)
      .def_rw("recent_held_tokens", &DraftConfig::recent_held_tokens)
      .def_rw("input_smoothing", &DraftConfig::input_smoothing)
      .def_rw("datastore_smoothing", &DraftConfig::datastore_smoothing)
      .def_rw("node_score", &DraftConfig::node_score)
      .def("validate", [](const DraftConfig& c) { validate(c); });
}

// SubIndex: built from tokens, extended, or wrapping a snapshot's arrays; its arrays as
// read-only views, and prefix search. Datastore: a set of sub-indices (the first
// base_count of them the base).
void bind_datastore(nb::module_& m) {
  nb::class_<SubIndex>(m, "SubIndex")
      .def_static(
          "build",
          [](In<int32_t> tokens, int32_t vocab_size) {
            std::vector<int32_t> copy(tokens.data(), tokens.data() + tokens.shape(0));
            return SubIndex::build(std::move(copy), vocab_size);
          },
          "tokens"_a, "vocab_size"_a, without_gil)  // drafting threads keep running
      .def_static(
          "build_extended",
          [](const SubIndex& base, In<int32_t> tokens) {
            // base's text + separator + tokens, copied and built without the GIL.
            std::vector<int32_t> text;
            text.reserve(base.num_tokens() + 1 + tokens.shape(0));
            text.insert(text.end(), base.tokens(), base.tokens() + base.num_tokens());
            if (base.num_tokens() > 0 && tokens.shape(0) > 0) text.push_back(kSeparator);
            text.insert(text.end(), tokens.data(), tokens.data() + tokens.shape(0));
            return SubIndex::build(std::move(text), base.vocab_size());
          },
          "base"_a, "tokens"_a, without_gil)
      .def_static(
          "wrap",
          [](In<int32_t> tokens, In<int32_t> suffix_array, int32_t vocab_size, nb::object keep) {
            if (tokens.shape(0) != suffix_array.shape(0)) {
              throw std::invalid_argument(
                  "tokens has " + std::to_string(tokens.shape(0)) +
                  " entries but suffix_array has " + std::to_string(suffix_array.shape(0)));
            }
            std::shared_ptr<const void> owner = keep_alive(std::move(keep));
            return released([&] {
              return SubIndex::wrap(tokens.data(), suffix_array.data(), tokens.shape(0),
                                    vocab_size, std::move(owner));
            });
          },
          "tokens"_a, "suffix_array"_a, "vocab_size"_a, "keep_alive"_a)
      .def_prop_ro("num_tokens", &SubIndex::num_tokens)
      .def_prop_ro("vocab_size", &SubIndex::vocab_size)
      .def_prop_ro("resident_bytes", &SubIndex::resident_bytes)
      .def("tokens", [](nb::handle self) { return view(self, &SubIndex::tokens); })
      .def("suffix_array", [](nb::handle self) { return view(self, &SubIndex::suffix_array); })
      .def(
          "find_range",
          [](const SubIndex& s, In<int32_t> prefix) {
            if (prefix.shape(0) > (1u << 20)) throw std::invalid_argument("prefix too long");
            const SaRange r = s.find_range(prefix.data(), static_cast<int32_t>(prefix.shape(0)));
            return std::make_tuple(r.begin, r.end);
          },
          "prefix"_a);
  nb::class_<Datastore>(m, "Datastore")
      .def("__init__", &init_datastore, "sub_indices"_a, "base_count"_a = 0)
      .def_prop_ro("num_tokens", &Datastore::num_tokens)
      .def_prop_ro("resident_bytes", &Datastore::resident_bytes);
}

// Drafter: request states, batched drafting and explain.
void bind_drafter(nb::module_& m) {
  nb::class_<Drafter>(m, "Drafter")
      .def(nb::init<const DraftConfig&, int32_t, int32_t>(), "config"_a, "vocab_size"_a,
           "num_threads"_a)
      .def_prop_ro("num_threads", &Drafter::num_threads)
      .def_prop_ro("num_requests", &Drafter::num_requests)
      .def("set_datastore", &Drafter::set_datastore, "datastore"_a)
      .def(
          "start",
          [](Drafter& d, int64_t handle, In<int32_t> tokens, bool shared, int32_t group) {
            d.start(handle, tokens.data(), tokens.shape(0), shared, group);
          },
          "handle"_a, "tokens"_a, "shared"_a = true, "group"_a = 0, without_gil)
      .def(
          "add",
          [](Drafter& d, int64_t handle, In<int32_t> tokens) {
            d.add(handle, tokens.data(), tokens.shape(0));
          },
          "handle"_a, "tokens"_a, without_gil)
      .def("stop", &Drafter::stop, "handle"_a)
      .def(
          "hold",
          [](Drafter& d, int64_t position, In<int32_t> tokens) {
            return d.hold(position, tokens.data(), tokens.shape(0));
          },
          "position"_a, "tokens"_a, without_gil)
      .def("release_through", &Drafter::release_through, "position"_a, without_gil)
      .def_prop_ro("held", &Drafter::held)
      .def("num_tokens", &Drafter::num_tokens, "handle"_a)
      .def("request_bytes", &Drafter::request_bytes, "handle"_a)
      .def(
          "tokens",
          [](const Drafter& d, int64_t handle) { return to_numpy(d.tokens(handle)); },
          "handle"_a)
      .def("draft_batch", &batch_call, "handles"_a, "tokens"_a, "offsets"_a, "budgets"_a)
      .def(
          "explain",
          [](Drafter& d, int64_t handle, int32_t budget) {
            Draft draft = released([&] { return d.explain(handle, budget); });
            return std::make_tuple(to_numpy(std::move(draft.tokens)),
                                   to_numpy(std::move(draft.parents)),
                                   to_numpy(std::move(draft.scores)),
                                   to_numpy(std::move(draft.features)));
          },
          "handle"_a, "budget"_a);
}

}  // namespace
}  // namespace drafter

NB_MODULE(_core, m) {
  using namespace drafter;
  m.doc() = "Native SSSD drafting core: suffix-array sub-indices, input tries, tree fusion.";
  bind_functions(m);
  bind_config(m);
  bind_datastore(m);
  bind_drafter(m);
  const int32_t feature_count = kScoreFeatures;  // an int, not the (unbound) enum
  m.attr("SCORE_FEATURE_COUNT") = feature_count;
  m.attr("RECENT_BYTES_PER_TOKEN") = RecentTier::kBytesPerToken;
}
