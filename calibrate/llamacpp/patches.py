"""The project's own patches to a llama.cpp tree, applied by anchors (no llama.cpp code is
committed here: each patch names a short anchor line of the upstream file and the lines of our
own it inserts before or after it).

``copy-log`` (in ``ggml/src/ggml-backend.cpp``, ``ggml_backend_sched_compute_splits``): when the
environment variable ``PREFETCH_SIM_COPY_LOG`` is set, each graph compute prints one line to
stderr with what the scheduler copied into the GPU's split inputs::

    prefetch-sim copy-log: n_tokens=512 moe_splits=144 used_experts=18372 expert_slots=18432 \
expert_bytes_copied=... expert_bytes_total=... other_bytes=...

``used_experts`` / ``expert_slots`` is the share of (layer, expert-tensor, expert) triples the
selective expert copy moved; ``expert_bytes_copied`` the bytes it moved (runs of consecutive
experts plus ggml's 512-byte padding tail), ``expert_bytes_total`` the bytes of the whole
expert tensors it read from; ``other_bytes`` every other split input copied (host-resident
dense weights and activations crossing backends). Unset, the patch costs one cached ``getenv``
per graph and changes nothing else. This is how the harness proves a synthetic GGUF's routing:
the copy-bound regime must move the bytes the routing model predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .build import BuildError


@dataclass(frozen=True)
class Insertion:
    """Insert ``lines`` before or after the single line of ``file`` that contains ``anchor``.

    Attributes:
        file: path relative to the llama.cpp tree.
        anchor: text that must occur in exactly one line of the file (leading spaces ignored).
        lines: the inserted code (our own).
        after: insert after the anchor line (else before).
        following: when set, ``anchor`` is the first line containing it after the one line that
            contains ``following`` (for an anchor that recurs, e.g. a loop header in a function).
    """

    file: str
    anchor: str
    lines: str
    after: bool = True
    following: str = ""


@dataclass(frozen=True)
class NewFile:
    """A file of our own added to the llama.cpp tree (``file`` must not exist there).

    Attributes:
        file: path relative to the llama.cpp tree.
        text: its content.
    """

    file: str
    text: str


MARK = "// prefetch-sim copy-log"

COPY_LOG = (
    Insertion("ggml/src/ggml-backend.cpp", "std::vector<ggml_bitset_t> used_ids;", f"""\
    {MARK}: counters of what this graph compute copies (printed when PREFETCH_SIM_COPY_LOG is set)
    static const bool psim_log = getenv("PREFETCH_SIM_COPY_LOG") != nullptr;
    size_t psim_expert_copied = 0, psim_expert_total = 0, psim_other = 0;
    long long psim_used = 0, psim_slots = 0, psim_tokens = -1;
    int psim_moe_splits = 0;
"""),
    Insertion("ggml/src/ggml-backend.cpp", "const size_t padding_end = last_id < n_expert - 1 ? padding : 0;", f"""\
                        {MARK}
                        if (psim_log) {{ psim_expert_copied += expert_size_copy + padding_end; }}
"""),
    Insertion("ggml/src/ggml-backend.cpp", "while (!ggml_bitset_get(used_ids.data(), id)) {", f"""\
                    {MARK}
                    if (psim_log) {{
                        psim_expert_total += ggml_nbytes(input);
                        psim_slots += n_expert;
                        for (int64_t e = 0; e < n_expert; e++) {{
                            psim_used += ggml_bitset_get(used_ids.data(), e) ? 1 : 0;
                        }}
                        psim_tokens = ids_tensor->ne[1];
                        psim_moe_splits++;
                    }}
""", after=False),
    Insertion("ggml/src/ggml-backend.cpp", "// try async copy, but if not possible, we can still use a sync copy", f"""\
                    {MARK}
                    if (psim_log) {{ psim_other += ggml_nbytes(input); }}
""", after=False),
    Insertion("ggml/src/ggml-backend.cpp", "prev_backend_id = split_backend_id;", f"""\
        {MARK}: last split of the graph done
        if (psim_log && split_id == sched->n_splits - 1) {{
            fprintf(stderr, "prefetch-sim copy-log: n_tokens=%lld moe_splits=%d used_experts=%lld expert_slots=%lld "
                    "expert_bytes_copied=%zu expert_bytes_total=%zu other_bytes=%zu\\n", psim_tokens, psim_moe_splits,
                    psim_used, psim_slots, psim_expert_copied, psim_expert_total, psim_other);
        }}
"""),
)

PERF_MARK = "// prefetch-sim perf-cases"

#: ``perf-cases`` (in ``tests/test-backend-ops.cpp``): with ``PREFETCH_SIM_PERF_CASES=FILE`` the
#: perf mode times the cases listed in FILE (the models' own shapes, written by
#: :mod:`calibrate.llamacpp.perf_cases`) instead of its fixed list; one case per line::
#:
#:     MUL_MAT <type_a> <m> <n> <k>                      # weight (k, m) x activations (k, n)
#:     MUL_MAT_ID <type_a> <n_expert> <n_used> <m> <n> <k>
#:     FLASH_ATTN_EXT <head_dim> <n_head> <n_head_kv> <kv> <n_tokens>
#:
#:     MUL_MAT_B <type_a> <type_b> <m> <n> <k> <bs2> <nr2>  # a (k, m, bs2) x b (k, n, bs2*nr2)
#:     SOFT_MAX <kv> <n_tokens> <n_head>                  # masked softmax of (kv, n_tokens, n_head)
#:
#: ``PREFETCH_SIM_PERF_MIN_US=T`` times each case for at least T µs (default: the program's 1 s),
#: and ``PREFETCH_SIM_THREADS=N`` sets the CPU backend's threads (test-backend-ops uses half the
#: hardware threads; llama-bench all of them by default).
PERF_CASES = (
    Insertion("tests/test-backend-ops.cpp", "static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {", f"""\
    {PERF_MARK}: the cases of PREFETCH_SIM_PERF_CASES instead of the fixed list
    if (const char * psim_file = getenv("PREFETCH_SIM_PERF_CASES")) {{
        std::vector<std::unique_ptr<test_case>> psim_cases;
        auto psim_lower = [](std::string v) {{
            for (auto & c : v) {{ c = (char) tolower((unsigned char) c); }}
            return v;
        }};
        auto psim_type = [&](const std::string & name) {{
            for (int t = 0; t < GGML_TYPE_COUNT; t++) {{
                const char * tn = ggml_type_name((ggml_type) t);
                if (tn && psim_lower(name) == psim_lower(tn)) {{ return (ggml_type) t; }}
            }}
            fprintf(stderr, "prefetch-sim perf-cases: unknown ggml type '%s'\\n", name.c_str());
            exit(2);
        }};
        std::ifstream psim_in(psim_file);
        if (!psim_in) {{ fprintf(stderr, "prefetch-sim perf-cases: cannot read %s\\n", psim_file); exit(2); }}
        std::string psim_line;
        while (std::getline(psim_in, psim_line)) {{
            std::istringstream ls(psim_line);
            std::string op, ta;
            if (!(ls >> op) || op[0] == '#') {{ continue; }}
            if (op == "MUL_MAT") {{
                int64_t m, n, k;
                if (!(ls >> ta >> m >> n >> k)) {{ fprintf(stderr, "prefetch-sim perf-cases: bad line: %s\\n", psim_line.c_str()); exit(2); }}
                psim_cases.emplace_back(new test_mul_mat(psim_type(ta), GGML_TYPE_F32, m, n, k, {{1, 1}}, {{1, 1}}));
            }} else if (op == "MUL_MAT_ID") {{
                int64_t ne, nu, m, n, k;
                if (!(ls >> ta >> ne >> nu >> m >> n >> k)) {{ fprintf(stderr, "prefetch-sim perf-cases: bad line: %s\\n", psim_line.c_str()); exit(2); }}
                psim_cases.emplace_back(new test_mul_mat_id(psim_type(ta), GGML_TYPE_F32, (int) ne, (int) nu, false, m, n, k));
            }} else if (op == "FLASH_ATTN_EXT") {{
                int64_t hd, nh, nkv, kv, nb;
                if (!(ls >> hd >> nh >> nkv >> kv >> nb) || nkv < 1 || nh % nkv) {{ fprintf(stderr, "prefetch-sim perf-cases: bad line: %s\\n", psim_line.c_str()); exit(2); }}
                psim_cases.emplace_back(new test_flash_attn_ext(hd, hd, nkv, {{nh / nkv, 1}}, kv, nb, true, false, 0.0f, 0.0f,
                                                                 GGML_PREC_F32, GGML_TYPE_F16, GGML_TYPE_F16));
            }} else if (op == "MUL_MAT_B") {{
                // batched/broadcast matmul: a (k, m, bs2), b (k, n, bs2*nr2): the unfused attention's
                // KQ and KQV (bs2 = KV heads, nr2 = query heads per KV head), or bs2 distinct weight
                // matrices read cold (their total bytes beyond the GPU's L2 / the CPU's L3)
                std::string tb;
                int64_t m, n, k, bs2, nr2;
                if (!(ls >> ta >> tb >> m >> n >> k >> bs2 >> nr2) || bs2 < 1 || nr2 < 1) {{ fprintf(stderr, "prefetch-sim perf-cases: bad line: %s\\n", psim_line.c_str()); exit(2); }}
                psim_cases.emplace_back(new test_mul_mat(psim_type(ta), psim_type(tb), m, n, k, {{bs2, 1}}, {{nr2, 1}}));
            }} else if (op == "SOFT_MAX") {{
                // the unfused attention's masked softmax: scores (kv, n_tokens, n_head), one mask
                int64_t kv, nb, nh;
                if (!(ls >> kv >> nb >> nh) || nh < 1) {{ fprintf(stderr, "prefetch-sim perf-cases: bad line: %s\\n", psim_line.c_str()); exit(2); }}
                psim_cases.emplace_back(new test_soft_max(GGML_TYPE_F32, {{kv, nb, 1, 1}}, true, false, GGML_TYPE_F32, {{nh, 1}}, 0.1f));
            }} else {{
                fprintf(stderr, "prefetch-sim perf-cases: unknown op '%s'\\n", op.c_str());
                exit(2);
            }}
        }}
        return psim_cases;
    }}
"""),
    Insertion("tests/test-backend-ops.cpp", "int total_runs = 0;", f"""\
        {PERF_MARK}: a shorter minimum time per case
        static const int64_t psim_min_us = getenv("PREFETCH_SIM_PERF_MIN_US") ? atoll(getenv("PREFETCH_SIM_PERF_MIN_US")) : 1000*1000;
"""),
    Insertion("tests/test-backend-ops.cpp", "reinit_perf_iter(ctx.get());", f"""\
            if (total_time_us >= psim_min_us) {{ break; }}  {PERF_MARK}
"""),
    Insertion("tests/test-backend-ops.cpp", "ggml_backend_set_n_threads_fn(backend.get(), std::max<int>(1, N_THREADS/2));", f"""\
            {PERF_MARK}: the CPU backend's threads
            if (const char * psim_threads = getenv("PREFETCH_SIM_THREADS")) {{
                ggml_backend_set_n_threads_fn(backend.get(), std::max(1, atoi(psim_threads)));
            }}
"""),
)

SPLIT_MARK = "// prefetch-sim split-time"

#: ``split-time`` (in ``ggml/src/ggml-backend.cpp``, ``ggml_backend_sched_compute_splits``): with
#: ``PREFETCH_SIM_SPLIT_TIME`` set, each graph compute prints one line to stderr with host
#: timestamps of every split (``ggml_time_us``)::
#:
#:     prefetch-sim split-time: graph=7 ne1=512 n_splits=3 gap_us=812 total_us=20417 \
#: splits=0:CPU:0:0:0:0:14,1:CUDA0:1:11010048:95:210:17,...
#:
#: ``gap_us``: host time from the end of the previous graph compute (llama.cpp's graph build,
#: allocation, input setting, and any synchronisation between graphs); ``ne1``: ``ne[1]`` of the
#: graph's first node (the ubatch's tokens for llama.cpp's graphs, whose first node is the token
#: embedding's GET_ROWS). Per split ``id:backend:n_inputs:input_bytes:drain_us:copy_us:compute_us``:
#: ``drain_us`` the wait for the split's and its inputs' backends to finish their queued work,
#: ``copy_us`` the input copies (a MoE weight's selective copy included), ``compute_us`` the
#: compute call (the whole computation on the CPU backend, which is synchronous; the kernel
#: launches on a GPU). To separate drain from copy the patch synchronises those backends before
#: the copies, which the scheduler does first anyway when it has no events (one GPU, no pipeline
#: parallelism: ``n_copies == 1``); with events it does not time the drain (``drain_us`` 0).
SPLIT_TIME = (
    Insertion("ggml/src/ggml-backend.cpp", "int prev_backend_id = -1;", f"""\
    {SPLIT_MARK}: per-split host timestamps (printed when PREFETCH_SIM_SPLIT_TIME is set)
    static const bool psim_st = getenv("PREFETCH_SIM_SPLIT_TIME") != nullptr;
    static int64_t psim_st_prev_end = 0;
    static long long psim_st_graph = 0;
    std::vector<char> psim_st_buf;
    const int64_t psim_st_t0 = psim_st ? ggml_time_us() : 0;
    int64_t psim_st_ts = 0, psim_st_td = 0, psim_st_ti = 0;
    size_t psim_st_bytes = 0;
"""),
    Insertion("ggml/src/ggml-backend.cpp", "struct ggml_backend_sched_split * split = &splits[split_id];", f"""\
        {SPLIT_MARK}
        if (psim_st) {{
            psim_st_ts = ggml_time_us();
            psim_st_bytes = 0;
            for (int i = 0; i < split->n_inputs; i++) {{ psim_st_bytes += ggml_nbytes(split->inputs[i]); }}
            if (split->n_inputs > 0 && sched->n_copies == 1) {{
                ggml_backend_synchronize(sched->backends[split->backend_id]);
                for (int i = 0; i < split->n_inputs; i++) {{
                    ggml_backend_synchronize(ggml_backend_sched_get_tensor_backend(sched, split->inputs[i]));
                }}
            }}
            psim_st_td = ggml_time_us();
        }}
"""),
    Insertion("ggml/src/ggml-backend.cpp", "if (!sched->callback_eval) {", f"""\
        if (psim_st) {{ psim_st_ti = ggml_time_us(); }}  {SPLIT_MARK}
""", after=False),
    Insertion("ggml/src/ggml-backend.cpp", "// record the event of this split", f"""\
        {SPLIT_MARK}
        if (psim_st) {{
            char psim_b[192];
            const int psim_n = snprintf(psim_b, sizeof(psim_b), "%s%d:%s:%d:%zu:%lld:%lld:%lld", split_id ? "," : "", split_id,
                     ggml_backend_name(split_backend), split->n_inputs, psim_st_bytes, (long long) (psim_st_td - psim_st_ts),
                     (long long) (psim_st_ti - psim_st_td), (long long) (ggml_time_us() - psim_st_ti));
            psim_st_buf.insert(psim_st_buf.end(), psim_b, psim_b + std::min<int>(std::max(psim_n, 0), (int) sizeof(psim_b) - 1));
        }}
""", after=False),
    Insertion("ggml/src/ggml-backend.cpp", "prev_backend_id = split_backend_id;", f"""\
        {SPLIT_MARK}: last split of the graph done
        if (psim_st && split_id == sched->n_splits - 1) {{
            const int64_t psim_te = ggml_time_us();
            psim_st_buf.push_back('\\0');
            const ggml_tensor * psim_n0 = splits[0].graph.n_nodes > 0 ? splits[0].graph.nodes[0] : nullptr;
            fprintf(stderr, "prefetch-sim split-time: graph=%lld ne1=%lld n_splits=%d gap_us=%lld total_us=%lld splits=%s\\n",
                    psim_st_graph++, psim_n0 ? (long long) psim_n0->ne[1] : -1LL, sched->n_splits,
                    psim_st_prev_end ? (long long) (psim_st_t0 - psim_st_prev_end) : -1LL,
                    (long long) (psim_te - psim_st_t0), psim_st_buf.data());
            psim_st_prev_end = psim_te;
        }}
"""),
)

PHASE_MARK = "// prefetch-sim phase-time"

#: ``phase-time`` (in ``src/llama-context.cpp`` and ``src/llama-graph.cpp``): with
#: ``PREFETCH_SIM_PHASE_TIME`` set, llama.cpp's host work around each ubatch's graph compute is
#: timed (``ggml_time_us``, absolute stamps so the lines of one run can be put on one timeline)::
#:
#:     prefetch-sim phase-time: n_tokens=2048 reused=1 t0=123 apply_us=4 build_us=0 alloc_us=0 \
#: inputs_us=8010 compute_us=6472
#:     prefetch-sim input-time: n_tokens=2048 inputs=N27llm_graph_input_attn_kv_iswa:8001,...
#:     prefetch-sim sync-time: t0=130000 wait_us=150123
#:     prefetch-sim decode-time: t0=99
#:
#: ``t0`` of a phase line is the entry of ``process_ubatch``; ``apply_us`` the memory context's
#: apply (the KV slot), ``build_us`` the graph build and ``alloc_us`` the scheduler's split and
#: allocation (both 0 when llama.cpp reuses the previous graph, ``reused=1``), ``inputs_us`` the
#: graph inputs' ``set_input`` (KQ masks, positions, KV indices), ``compute_us`` the scheduler's
#: ``graph_compute_async`` (CPU splits run in it, GPU splits are launched). The input line gives
#: each input's ``set_input`` time by its C++ type (``typeid(...).name()``, summed over inputs of
#: one type). The sync line is ``llama_synchronize``'s wait for the backends; the decode line
#: the entry of ``llama_decode``. Unset, the patch costs one cached ``getenv`` per call.
PHASE_TIME = (
    Insertion("src/llama-context.cpp", "llm_graph_result * llama_context::process_ubatch(const llama_ubatch & ubatch", f"""\
    {PHASE_MARK}: host phases of one ubatch (printed when PREFETCH_SIM_PHASE_TIME is set)
    static const bool psim_pt = getenv("PREFETCH_SIM_PHASE_TIME") != nullptr;
    const int64_t psim_pt0 = psim_pt ? ggml_time_us() : 0;
    int64_t psim_pta = 0, psim_ptb = 0, psim_ptp = 0, psim_pti = 0;
    int psim_reused = 1;
"""),
    Insertion("src/llama-context.cpp", "const auto gparams = graph_params(res, ubatch, mctx, gtype);", f"""\
    if (psim_pt) {{ psim_pta = ggml_time_us(); }}  {PHASE_MARK}
""", after=False),
    Insertion("src/llama-context.cpp", "gf = model.build_graph(gparams);", f"""\
        if (psim_pt) {{ psim_ptb = ggml_time_us(); psim_reused = 0; }}  {PHASE_MARK}
""", following="res->can_reuse(gparams)"),
    Insertion("src/llama-context.cpp", "// set the input data for the input tensors", f"""\
    if (psim_pt) {{ psim_ptp = ggml_time_us(); }}  {PHASE_MARK}
""", after=False),
    Insertion("src/llama-context.cpp", "res->set_inputs(&ubatch);", f"""\
        if (psim_pt) {{ psim_pti = ggml_time_us(); }}  {PHASE_MARK}
""", following="llm_graph_result * llama_context::process_ubatch(const llama_ubatch & ubatch"),
    Insertion("src/llama-context.cpp", "const auto status = graph_compute(res->get_gf(), ubatch.n_tokens > 1);", f"""\
    {PHASE_MARK}
    if (psim_pt) {{
        const int64_t psim_ptc = ggml_time_us();
        if (psim_reused) {{ psim_ptb = psim_pta; }}
        fprintf(stderr, "prefetch-sim phase-time: n_tokens=%u reused=%d t0=%lld apply_us=%lld build_us=%lld alloc_us=%lld "
                "inputs_us=%lld compute_us=%lld\\n", (unsigned) ubatch.n_tokens, psim_reused, (long long) psim_pt0,
                (long long) (psim_pta - psim_pt0), (long long) (psim_ptb - psim_pta), (long long) (psim_ptp - psim_ptb),
                (long long) (psim_pti - psim_ptp), (long long) (psim_ptc - psim_pti));
    }}
"""),
    Insertion("src/llama-context.cpp", "ggml_backend_sched_synchronize(sched.get());", f"""\
    {PHASE_MARK}
    static const bool psim_pts = getenv("PREFETCH_SIM_PHASE_TIME") != nullptr;
    const int64_t psim_pts0 = psim_pts ? ggml_time_us() : 0;
""", after=False, following="void llama_context::synchronize() {"),
    Insertion("src/llama-context.cpp", "// FIXME: if multiple single tokens are evaluated without a synchronization,", f"""\
    {PHASE_MARK}
    if (psim_pts) {{
        fprintf(stderr, "prefetch-sim sync-time: t0=%lld wait_us=%lld\\n", (long long) psim_pts0,
                (long long) (ggml_time_us() - psim_pts0));
    }}
""", after=False),
    Insertion("src/llama-context.cpp", "int llama_context::decode(const llama_batch_ext & batch_inp) {", f"""\
    {PHASE_MARK}
    static const bool psim_ptd = getenv("PREFETCH_SIM_PHASE_TIME") != nullptr;
    if (psim_ptd) {{ fprintf(stderr, "prefetch-sim decode-time: t0=%lld\\n", (long long) ggml_time_us()); }}
"""),
    Insertion("src/llama-graph.cpp", '#include "llama-graph.h"', f"""\
{PHASE_MARK}: per-input set_input times
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <typeinfo>
"""),
    Insertion("src/llama-graph.cpp", "input->set_input(ubatch);", f"""\
        {PHASE_MARK}
        static const bool psim_it = getenv("PREFETCH_SIM_PHASE_TIME") != nullptr;
        const int64_t psim_it0 = psim_it ? ggml_time_us() : 0;
""", after=False),
    Insertion("src/llama-graph.cpp", "input->set_input(ubatch);", f"""\
        {PHASE_MARK}
        if (psim_it) {{
            static std::map<std::string, long long> psim_acc;
            psim_acc[typeid(*input).name()] += (long long) (ggml_time_us() - psim_it0);
            if (&input == &inputs.back()) {{
                std::string psim_s;
                for (const auto & kv : psim_acc) {{
                    psim_s += (psim_s.empty() ? "" : ",") + kv.first + ":" + std::to_string(kv.second);
                }}
                fprintf(stderr, "prefetch-sim input-time: n_tokens=%u inputs=%s\\n", (unsigned) ubatch->n_tokens, psim_s.c_str());
                psim_acc.clear();
            }}
        }}
"""),
)

REALLOC_MARK = "// prefetch-sim realloc-log"

#: ``realloc-log`` (``ggml/src/ggml-alloc.c`` and ``ggml/src/ggml-backend.cpp``): with
#: ``PREFETCH_SIM_REALLOC_LOG`` set, every graph whose allocation cannot reuse the scheduler's last
#: plan prints why, before ``ggml_backend_sched_alloc_splits`` synchronises every backend (waits for
#: the GPU) and re-plans the buffers::
#:
#:     prefetch-sim realloc-log: gallocr nodes 1727 -> 1731 leafs 310 -> 310
#:     prefetch-sim realloc-log: gallocr node 12 kq_mask-0 (NONE) size 1048576 > size_max 524288
#:     prefetch-sim realloc-log: gallocr src 1 kq_mask of node 40 __fattn__-0 size 1048576 > size_max 524288
#:     prefetch-sim realloc-log: reserve backend_ids_changed=0 nodes=1731 leafs=310
#:
#: (the first invalid node or source only; ``backend_ids_changed=1`` re-plans without asking the
#: allocator). Unset, it costs one cached ``getenv`` per graph and changes nothing else.
REALLOC_LOG = (
    Insertion("ggml/src/ggml-alloc.c", "static bool ggml_gallocr_needs_realloc(ggml_gallocr_t galloc, struct ggml_cgraph * graph) {", f"""\
    {REALLOC_MARK}: why this graph does not fit the last plan (printed when PREFETCH_SIM_REALLOC_LOG is set)
    {{
        static int psim_rl = -1;
        if (psim_rl < 0) {{ psim_rl = getenv("PREFETCH_SIM_REALLOC_LOG") != NULL; }}
        if (psim_rl) {{
            if (galloc->n_nodes != graph->n_nodes || galloc->n_leafs != graph->n_leafs) {{
                fprintf(stderr, "prefetch-sim realloc-log: gallocr nodes %d -> %d leafs %d -> %d\\n",
                        galloc->n_nodes, graph->n_nodes, galloc->n_leafs, graph->n_leafs);
            }} else {{
                for (int psim_i = 0; psim_i < graph->n_nodes; psim_i++) {{
                    struct ggml_tensor * psim_nd = graph->nodes[psim_i];
                    struct node_alloc * psim_na = &galloc->node_allocs[psim_i];
                    if (!ggml_gallocr_node_needs_realloc(galloc, psim_nd, &psim_na->dst)) {{
                        fprintf(stderr, "prefetch-sim realloc-log: gallocr node %d %s (%s) size %zu > size_max %zu\\n", psim_i,
                                psim_nd->name, ggml_op_desc(psim_nd), ggml_nbytes(psim_nd), psim_na->dst.size_max);
                        break;
                    }}
                    int psim_bad = -1;
                    for (int psim_j = 0; psim_j < GGML_MAX_SRC; psim_j++) {{
                        if (psim_nd->src[psim_j] != NULL && !ggml_gallocr_node_needs_realloc(galloc, psim_nd->src[psim_j], &psim_na->src[psim_j])) {{
                            psim_bad = psim_j;
                            break;
                        }}
                    }}
                    if (psim_bad >= 0) {{
                        fprintf(stderr, "prefetch-sim realloc-log: gallocr src %d %s of node %d %s size %zu > size_max %zu\\n", psim_bad,
                                psim_nd->src[psim_bad]->name, psim_i, psim_nd->name, ggml_nbytes(psim_nd->src[psim_bad]),
                                psim_na->src[psim_bad].size_max);
                        break;
                    }}
                }}
            }}
        }}
    }}
"""),
    Insertion("ggml/src/ggml-backend.cpp", "// the re-allocation may cause the split inputs to be moved to a different address", f"""\
        {{  {REALLOC_MARK}
            static const bool psim_rl = getenv("PREFETCH_SIM_REALLOC_LOG") != nullptr;
            if (psim_rl) {{
                fprintf(stderr, "prefetch-sim realloc-log: reserve backend_ids_changed=%d nodes=%d leafs=%d\\n",
                        (int) backend_ids_changed, sched->graph.n_nodes, sched->graph.n_leafs);
            }}
        }}
""", after=False),
)

NODE_MARK = "// prefetch-sim node-time"

#: ``node-time`` (``ggml/src/ggml-cpu/ggml-cpu.c``): with ``PREFETCH_SIM_NODE_TIME`` set, every graph
#: the CPU backend computes (one per CPU split) prints one line from its thread 0 after the last
#: barrier::
#:
#:     prefetch-sim node-time: threads 16 nodes 7 | MUL_MAT_ID ffn_moe_gate-0 212.4 | ADD_ID ffn_moe_gate_biased-0 9.8 | ...
#:
#: each computed node's op, name and microseconds from the end of the previous node's barrier
#: (the first: from thread 0's start in the graph) to the end of its own barrier, i.e. the node's
#: work on the slowest thread plus the barrier that closes it. Nodes a fused op swallowed are not
#: listed. At most 4096 nodes per line (``nodes`` gives the count). Unset, it costs one cached
#: ``getenv`` per graph on thread 0 and changes nothing else.
NODE_TIME = (
    Insertion("ggml/src/ggml-cpu/ggml-cpu.c",
              "for (int node_n = 0; node_n < cgraph->n_nodes && atomic_load_explicit(&tp->abort, memory_order_relaxed) != node_n; node_n++) {",
              f"""\
    {NODE_MARK}: per-node times of this CPU graph (printed when PREFETCH_SIM_NODE_TIME is set)
    static int psim_nt = -1;
    const int psim_on = state->ith == 0 && (psim_nt >= 0 ? psim_nt : (psim_nt = getenv("PREFETCH_SIM_NODE_TIME") != NULL));
    int64_t psim_prev = psim_on ? ggml_time_us() : 0;
    int psim_cnt = 0;
    const struct ggml_tensor * psim_last = NULL;
    static const struct ggml_tensor * psim_nodes[4096];  // thread 0 of the CPU backend's one thread pool
    static int64_t psim_us[4096];
""", after=False),
    Insertion("ggml/src/ggml-cpu/ggml-cpu.c", "ggml_barrier(state->threadpool);", f"""\
            if (psim_on) {{  {NODE_MARK}
                const int64_t psim_now = ggml_time_us();
                if (psim_cnt < 4096) {{ psim_nodes[psim_cnt] = node; psim_us[psim_cnt] = psim_now - psim_prev; }}
                psim_cnt++;
                psim_prev = psim_now;
                psim_last = NULL;
            }}
""", following="if (node_n + 1 < cgraph->n_nodes) {"),
    Insertion("ggml/src/ggml-cpu/ggml-cpu.c", "if (node_n + 1 < cgraph->n_nodes) {", f"""\
        if (psim_on) {{ psim_last = node; }}  {NODE_MARK}
""", after=False),
    Insertion("ggml/src/ggml-cpu/ggml-cpu.c", "ggml_barrier(state->threadpool);", f"""\
    if (psim_on) {{  {NODE_MARK}
        const int64_t psim_now = ggml_time_us();
        if (psim_last != NULL) {{
            if (psim_cnt < 4096) {{ psim_nodes[psim_cnt] = psim_last; psim_us[psim_cnt] = psim_now - psim_prev; }}
            psim_cnt++;
        }}
        static char psim_line[1 << 18];
        int psim_len = snprintf(psim_line, sizeof(psim_line), "prefetch-sim node-time: threads %d nodes %d",
                                (int) params.nth, psim_cnt);
        for (int psim_i = 0; psim_i < psim_cnt && psim_i < 4096 && psim_len < (int) sizeof(psim_line) - 128; psim_i++) {{
            psim_len += snprintf(psim_line + psim_len, sizeof(psim_line) - psim_len, " | %s %s %.1f",
                                 ggml_op_desc(psim_nodes[psim_i]), psim_nodes[psim_i]->name, (double) psim_us[psim_i]);
        }}
        fprintf(stderr, "%s\\n", psim_line);
    }}
""", following='compute-done cplan %p last-graph'),
)

from .prefetch_patch import PREFETCH  # noqa: E402  (it builds on Insertion and NewFile above)

#: every patch, by name
PATCHES: dict[str, tuple[Insertion | NewFile, ...]] = {"copy-log": COPY_LOG, "perf-cases": PERF_CASES,
                                                        "split-time": SPLIT_TIME, "phase-time": PHASE_TIME,
                                                        "realloc-log": REALLOC_LOG, "node-time": NODE_TIME,
                                                        "prefetch": PREFETCH}


def _find(lines: list[str], ins: Insertion, name: str) -> int:
    """Index of the anchor line of ``ins`` in ``lines``."""
    def unique(text: str) -> int:
        hits = [i for i, ln in enumerate(lines) if text in ln]
        if len(hits) != 1:
            raise BuildError(f"patch {name}: anchor {text!r} found {len(hits)} times in {ins.file} "
                             "(this llama.cpp version differs from the one the patch was written for)")
        return hits[0]

    if not ins.following:
        return unique(ins.anchor)
    start = unique(ins.following)
    for i in range(start + 1, len(lines)):
        if ins.anchor in lines[i]:
            return i
    raise BuildError(f"patch {name}: anchor {ins.anchor!r} not found after {ins.following!r} in {ins.file} "
                     "(this llama.cpp version differs from the one the patch was written for)")


def apply(tree: str | Path, insertions: tuple[Insertion | NewFile, ...], name: str) -> bool:
    """Apply one patch to ``tree`` in place; False when it is already applied.

    Raises:
        BuildError: a file is missing, an anchor occurs in no line or in several, or a new file
            exists already with other content.
    """
    tree = Path(tree)
    new_files = [ins for ins in insertions if isinstance(ins, NewFile)]
    insertions = tuple(ins for ins in insertions if isinstance(ins, Insertion))
    for nf in new_files:
        p = tree / nf.file
        if p.is_file() and p.read_text() != nf.text:
            raise BuildError(f"patch {name}: {p} exists and is not the patch's own file")
    texts: dict[str, list[str]] = {}
    for ins in insertions:
        if ins.file not in texts:
            p = tree / ins.file
            if not p.is_file():
                raise BuildError(f"patch {name}: {p} not found")
            texts[ins.file] = p.read_text().splitlines(keepends=True)
    marks = {ins.lines.strip().split(": ")[0].split("\n")[0] for ins in insertions}
    if any(m in "".join(lines) for lines in texts.values() for m in marks):
        return False
    for ins in insertions:
        lines = texts[ins.file]
        at = _find(lines, ins, name) + (1 if ins.after else 0)
        lines[at:at] = ins.lines.splitlines(keepends=True)
    for f, lines in texts.items():
        (tree / f).write_text("".join(lines))
    for nf in new_files:
        (tree / nf.file).write_text(nf.text)
    return True


def apply_all(tree: str | Path) -> tuple[str, ...]:
    """Apply every patch in :data:`PATCHES`; returns their names."""
    for name, ins in PATCHES.items():
        apply(tree, ins, name)
    return tuple(PATCHES)


def parse_copy_log(text: str) -> list[dict[str, int]]:
    """The ``prefetch-sim copy-log:`` lines of a stderr log as dicts of ints (one per graph).

    Lines of other programs are ignored. A copy-log line is ``key=value`` tokens of integers the
    patch prints (counts and bytes: never negative); the used experts of a graph are at most its
    expert slots, and the bytes copied at most the expert tensors' bytes plus ggml's 512-byte
    padding tail per copied run.

    Raises:
        ValueError: a malformed or impossible copy-log line, naming its line number and the key.
    """
    out = []
    for n, ln in enumerate(text.splitlines(), 1):
        if "prefetch-sim copy-log:" not in ln:
            continue
        rec = {}
        for tok in ln.split("prefetch-sim copy-log:", 1)[1].split():
            k, sep, v = tok.partition("=")
            if not sep:
                raise ValueError(f"malformed copy-log line {n}: token {tok!r} is not key=value")
            try:
                rec[k] = int(v)
            except ValueError:
                raise ValueError(f"copy-log line {n}: {k}={v!r} is not an integer") from None
            if rec[k] < 0 and k != "n_tokens":
                raise ValueError(f"copy-log line {n}: {k}={v} is negative")
        if rec.get("used_experts", 0) > rec.get("expert_slots", rec.get("used_experts", 0)):
            raise ValueError(f"copy-log line {n}: used_experts={rec['used_experts']} is more than "
                             f"expert_slots={rec['expert_slots']}")
        if rec.get("moe_splits", 0) > 0 and rec.get("n_tokens", 1) <= 0:
            raise ValueError(f"copy-log line {n}: n_tokens={rec.get('n_tokens')} for a graph with MoE splits")
        out.append(rec)
    return out
