"""The project's prefetch patch to ggml's scheduler and llama-bench (issue: real prefetch in ggml).

Our own code, written from ``docs/model.md`` / the design's description of the three variants,
applied by anchors like the other patches (:mod:`calibrate.llamacpp.patches`). Everything is off
unless an environment variable or a llama-bench flag turns it on; off, the scheduler runs
upstream's code path unchanged (one branch per graph and per split input).

**Scheduler** (``ggml/src/ggml-backend.cpp``), read once per ``ggml_backend_sched_new``:

* ``GGML_SCHED_PREFETCH_WEIGHTS=1`` — ungated weight prefetch: every host-resident weight that a
  GPU split reads (the op-offload rule's copies at prefill: dense weights and *whole* expert
  tensors, no router ids needed) is copied one staged split ahead on a second backend instance of
  the same device (its own stream) into one of the device's staging slots; the split waits on the
  slot's *ready* event and reads the weight from the slot (the split input's data pointer is
  pointed at the slot while the split is launched); the slot is reused only after the *free* event
  recorded behind the split that read it. Two slots (``GGML_SCHED_PREFETCH_EXPERT_SLOTS`` > 2 gives
  more).
* ``GGML_SCHED_PREFETCH_GATE=N`` (default 512) — the MoE-batch gate of that mode: in a graph with
  MUL_MAT_ID ops whose batch (tokens: ``ids->ne[1]``, the largest in the graph) is below N the
  graph runs upstream's path (selective expert copy). 0 = ungated. The staging slots stay reserved.
* ``GGML_SCHED_PREFETCH_EXPERT_SLOTS=N`` (with weights off) — expert staging slots: only the expert
  tensors of MUL_MAT_ID ops that fire (tokens x top-k >= 2 x n_expert, i.e. prefill) are staged,
  whole, one split ahead, into N rotating slots; other host weights take upstream's path.

Correctness rules (where reviews of earlier implementations found bugs):

* staging state is per device: each GPU backend of the scheduler has its own copy backend, slots
  and events, and a split reads only slots of its own backend's device;
* a slot is (re)allocated only after synchronising the device's copy stream and compute stream,
  so no fired copy or reading split is outstanding (the same on free and at scheduler free);
* a slot holds each staged tensor at the buffer type's alloc size
  (``ggml_backend_buft_get_alloc_size``: CUDA pads quantised rows to 512 elements) and the
  padding past ``ggml_nbytes`` is written with zeros on the copy stream (MMQ reads it), copied
  from a pinned zero buffer of the device's host buffer type: a copy from pageable memory makes
  the host wait for the copy stream (CUDA stages pageable copies in stream order), which would
  stall the host behind the weight copy it has just queued;
* only contiguous weights of host buffers (``GGML_BACKEND_BUFFER_USAGE_WEIGHTS``,
  ``ggml_backend_buffer_is_host``) are staged, and not when a node of the split is a view of the
  split input (its address would not follow the slot);
* prefetch is off with pipeline parallelism (``n_copies > 1``) and on a device without events or
  async copies (logged once).

Slot size: the largest staged bytes of one split, measured on the worst-case graph of
``ggml_backend_sched_reserve`` (so the VRAM is reserved up front, gated or not) and grown, after a
synchronisation, if a later graph needs more. ``psim_prefetch_staging_bytes()`` (exported) gives the
bytes of all staging slots; the scheduler prints one line per allocation::

    prefetch-sim prefetch: CUDA0 staging 2 slots x 113.25 MiB (weights=1 gate=512 expert_slots=0)

**llama-bench** (``tools/llama-bench/llama-bench.cpp``): list flags ``-pw/--prefetch-weights 0|1``,
``-pwg/--prefetch-gate N`` (default 512) and ``-pes/--prefetch-experts-slots N`` (default 0), swept
like llama-bench's other flags (each test instance is repeated for every combination, the
combinations innermost, so off and on alternate within one model load); each sets the variables
above before the test's context is created. The fields ``prefetch_weights``, ``prefetch_gate``,
``prefetch_expert_slots`` (INT) are printed before ``n_prompt`` (``sim.views.llamabench.FIELDS``), and after
each context is created one stderr line::

    prefetch-sim vram: model=M test=512/0/0 ub=512 pw=1 pwg=0 pes=0 used_mib=41234.0 staging_mib=226.5

(``used``: total − free of the first GPU from ``ggml_backend_dev_memory``, after the context's
reservation: weights, KV cache, compute buffer, staging).

**psim-decode** (``tools/llama-bench/psim-decode.cpp``, built beside llama-bench): the output
identity check — a fixed random prompt prefilled with every token's logits, then greedy decoding;
prints one JSON line with the generated tokens and an FNV-1a hash of the logits of the prompt and
of every step (run it with the variables off and on and compare).
"""

from __future__ import annotations

from pathlib import Path

from .patches import Insertion, NewFile

MARK = "// prefetch-sim prefetch"

_SCHED = "ggml/src/ggml-backend.cpp"

PREFETCH_SCHED = (
    Insertion(_SCHED, "struct ggml_backend_sched {", f"""\
{MARK}: staging state of one GPU backend of a scheduler (calibrate/llamacpp/prefetch_patch.py)
struct psim_pf_dev {{
    ggml_backend_t copy = nullptr;                 // a second backend instance of the device: the copy stream
    int n_slots = 0;
    size_t slot_size = 0;                          // bytes of each slot
    std::vector<ggml_backend_buffer_t> bufs;       // [n_slots]
    std::vector<ggml_tensor *> slot_t;             // [n_slots] an I8 tensor over the whole slot
    ggml_context * ctx = nullptr;                  // holds slot_t
    std::vector<ggml_backend_event_t> ready, freed; // [n_slots]: copy done / last reader done
    long long ring = 0;                            // slots handed out so far
    ggml_backend_buffer_t zeros = nullptr;         // pinned zeros: the source of the row padding
    bool disabled = false;
}};
static size_t psim_pf_total_bytes = 0;
#define PSIM_PF_ZEROS ((size_t) 1 << 20)           // bytes of pinned zeros (row padding is at most 512 elements)             // every scheduler's staging slots
extern "C" {{
GGML_API size_t psim_prefetch_staging_bytes(void);  // bytes of every scheduler's staging slots
}}
size_t psim_prefetch_staging_bytes(void) {{ return psim_pf_total_bytes; }}

""", after=False),
    Insertion(_SCHED, "int debug_prev_graph_size;", f"""\

    {MARK}: GGML_SCHED_PREFETCH_WEIGHTS / _GATE / _EXPERT_SLOTS, and the staging per backend
    int psim_pf_weights;
    int psim_pf_gate;
    int psim_pf_slots;
    struct psim_pf_dev * psim_pf[GGML_SCHED_MAX_BACKENDS];
"""),
    Insertion(_SCHED, "static enum ggml_status ggml_backend_sched_compute_splits(ggml_backend_sched_t sched) {", f"""\
{MARK}: the device staging of backend b, created on first use; nullptr when b cannot stage
static psim_pf_dev * psim_pf_get(ggml_backend_sched_t sched, int b) {{
    if (sched->psim_pf[b] != nullptr) {{
        return sched->psim_pf[b]->disabled ? nullptr : sched->psim_pf[b];
    }}
    psim_pf_dev * d = new psim_pf_dev();
    sched->psim_pf[b] = d;
    ggml_backend_dev_t dev = ggml_backend_get_device(sched->backends[b]);
    if (dev == nullptr || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_GPU) {{
        d->disabled = true;  // the CPU backend reads host weights in place
        return nullptr;
    }}
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(dev, &props);
    if (!props.caps.async || !props.caps.events) {{
        GGML_LOG_WARN("prefetch-sim prefetch: %s has no async copies or events: prefetch off there\\n", ggml_backend_name(sched->backends[b]));
        d->disabled = true;
        return nullptr;
    }}
    d->copy = ggml_backend_dev_init(dev, nullptr);
    if (d->copy == nullptr) {{
        GGML_LOG_WARN("prefetch-sim prefetch: cannot create a second backend on %s: prefetch off there\\n", ggml_backend_name(sched->backends[b]));
        d->disabled = true;
        return nullptr;
    }}
    d->n_slots = sched->psim_pf_weights ? std::max(2, sched->psim_pf_slots) : sched->psim_pf_slots;
    ggml_backend_buffer_type_t host_buft = ggml_backend_dev_host_buffer_type(dev);
    d->zeros = host_buft ? ggml_backend_buft_alloc_buffer(host_buft, PSIM_PF_ZEROS) : nullptr;
    if (d->zeros == nullptr || !ggml_backend_buffer_is_host(d->zeros)) {{
        GGML_LOG_WARN("prefetch-sim prefetch: %s has no pinned host buffer: prefetch off there\\n", ggml_backend_name(sched->backends[b]));
        if (d->zeros) {{ ggml_backend_buffer_free(d->zeros); d->zeros = nullptr; }}
        ggml_backend_free(d->copy);
        d->copy = nullptr;
        d->disabled = true;
        return nullptr;
    }}
    ggml_backend_buffer_clear(d->zeros, 0);
    for (int s = 0; s < d->n_slots; s++) {{
        d->ready.push_back(ggml_backend_event_new(dev));
        d->freed.push_back(ggml_backend_event_new(dev));
    }}
    return d;
}}

{MARK}: free a device's slots after its copy and compute streams are idle (no fired copy, no reader);
{MARK}: `compute`: null at scheduler free, where llama.cpp has freed the backends already (the caller synchronised)
static void psim_pf_release_slots(ggml_backend_t compute, psim_pf_dev * d) {{
    if (d->copy) {{ ggml_backend_synchronize(d->copy); }}
    if (compute) {{ ggml_backend_synchronize(compute); }}
    for (auto * buf : d->bufs) {{
        psim_pf_total_bytes -= ggml_backend_buffer_get_size(buf);
        ggml_backend_buffer_free(buf);
    }}
    d->bufs.clear();
    d->slot_t.clear();
    if (d->ctx) {{ ggml_free(d->ctx); d->ctx = nullptr; }}
    d->slot_size = 0;
}}

{MARK}: make every slot of backend b at least `need` bytes; false (and staging off on b) when VRAM is short
static bool psim_pf_reserve_slots(ggml_backend_sched_t sched, int b, psim_pf_dev * d, size_t need) {{
    if (need <= d->slot_size) {{
        return true;
    }}
    psim_pf_release_slots(sched->backends[b], d);
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(d->copy);
    ggml_init_params ip = {{ /*.mem_size =*/ (size_t) d->n_slots * ggml_tensor_overhead(), /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ true }};
    d->ctx = ggml_init(ip);
    for (int s = 0; s < d->n_slots; s++) {{
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, need);
        if (buf == nullptr) {{
            GGML_LOG_ERROR("prefetch-sim prefetch: %s: cannot allocate staging slot %d of %.2f MiB: prefetch off there\\n",
                           ggml_backend_name(sched->backends[b]), s, need / 1048576.0);
            psim_pf_release_slots(sched->backends[b], d);
            d->disabled = true;
            return false;
        }}
        ggml_backend_buffer_clear(buf, 0);
        ggml_tensor * t = ggml_new_tensor_1d(d->ctx, GGML_TYPE_I8, (int64_t) need);
        ggml_backend_tensor_alloc(buf, t, ggml_backend_buffer_get_base(buf));
        d->bufs.push_back(buf);
        d->slot_t.push_back(t);
        psim_pf_total_bytes += ggml_backend_buffer_get_size(buf);
    }}
    d->slot_size = need;
    GGML_LOG_INFO("prefetch-sim prefetch: %s staging %d slots x %.2f MiB (weights=%d gate=%d expert_slots=%d)\\n",
                  ggml_backend_name(sched->backends[b]), d->n_slots, need / 1048576.0, sched->psim_pf_weights,
                  sched->psim_pf_gate, sched->psim_pf_slots);
    return true;
}}

{MARK}: offset of each staged input of split `split_id` in its slot (SIZE_MAX: not staged); returns the bytes.
{MARK}: `sizing`: at reserve, before the graph is allocated (copies have no address yet, the gate does not apply).
static size_t psim_pf_mark(ggml_backend_sched_t sched, int split_id, std::vector<size_t> & off, bool sizing) {{
    ggml_backend_sched_split * split = &sched->splits[split_id];
    off.assign(split->n_inputs, SIZE_MAX);
    if (split->graph.n_nodes == 0 || sched->bufts[split->backend_id] == nullptr) {{
        return 0;
    }}
    ggml_backend_buffer_type_t buft = sched->bufts[split->backend_id];
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t used = 0;
    for (int i = 0; i < split->n_inputs; i++) {{
        ggml_tensor * input = split->inputs[i];
        if (input->buffer == nullptr || ggml_backend_buffer_get_usage(input->buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS ||
            !ggml_backend_buffer_is_host(input->buffer) || input->view_src != nullptr || !ggml_is_contiguous(input)) {{
            continue;
        }}
        ggml_tensor * input_cpy = tensor_copy(input, split->backend_id, sched->cur_copy);
        if (input_cpy == nullptr || (!sizing && input_cpy->data == nullptr)) {{
            continue;
        }}
        bool ok = true, expert = false, fires = false;
        for (int j = 0; j < split->graph.n_nodes && ok; j++) {{
            const ggml_tensor * node = split->graph.nodes[j];
            if (node->view_src == input_cpy) {{
                ok = false;  // a view's address is fixed at allocation: it would not follow the slot
            }}
            if (node->op == GGML_OP_MUL_MAT_ID && node->src[0] == input_cpy) {{
                const ggml_tensor * ids = node->src[2];
                expert = true;
                fires = fires || ids->ne[1] * ids->ne[0] >= 2 * input->ne[2];
            }}
        }}
        if (!ok) {{
            continue;
        }}
        if (!sched->psim_pf_weights && !(expert && (fires || sizing))) {{
            continue;  // expert-slot mode: only expert tensors of a MUL_MAT_ID that fires
        }}
        const size_t sz = ggml_backend_buft_get_alloc_size(buft, input);
        if (sz - ggml_nbytes(input) > PSIM_PF_ZEROS) {{
            continue;  // padding larger than the pinned zeros: upstream's copy
        }}
        off[i] = used;
        used += GGML_PAD(sz, align);
    }}
    return used;
}}

{MARK}: copy split `split_id`'s staged inputs into the next slot of its device, on the copy stream
static void psim_pf_fire(ggml_backend_sched_t sched, int split_id, const std::vector<size_t> & off, std::vector<int> & slot_of) {{
    ggml_backend_sched_split * split = &sched->splits[split_id];
    psim_pf_dev * d = sched->psim_pf[split->backend_id];
    const int slot = (int) (d->ring++ % d->n_slots);
    slot_of[split_id] = slot;
    ggml_backend_event_wait(d->copy, d->freed[slot]);  // the split that read this slot last is done
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(d->bufs[slot]);
    for (int i = 0; i < split->n_inputs; i++) {{
        if (off[i] == SIZE_MAX) {{
            continue;
        }}
        ggml_tensor * input = split->inputs[i];
        const size_t nb = ggml_nbytes(input);
        const size_t sz = ggml_backend_buft_get_alloc_size(buft, input);
        GGML_ASSERT(off[i] + sz <= d->slot_size);
        ggml_backend_tensor_set_async(d->copy, d->slot_t[slot], input->data, off[i], nb);
        if (sz > nb) {{
            GGML_ASSERT(sz - nb <= PSIM_PF_ZEROS);  // checked when the input was marked
            ggml_backend_tensor_set_async(d->copy, d->slot_t[slot], ggml_backend_buffer_get_base(d->zeros), off[i] + nb,
                                          sz - nb);  // row padding: zeros, from pinned memory (no host stall)
        }}
    }}
    ggml_backend_event_record(d->ready[slot], d->copy);
}}

""", after=False),
    Insertion(_SCHED, "for (int split_id = 0; split_id < sched->n_splits; split_id++) {", f"""\
    {MARK}: which split inputs this graph stages, and the first fire of each device
    std::vector<std::vector<size_t>> psim_pf_off;  // [split][input] offset in the slot, SIZE_MAX = upstream's copy
    std::vector<int> psim_pf_slot;                 // [split] slot, -1 = not staged
    std::vector<int> psim_pf_next;                 // [split] the next staged split of the same backend
    if ((sched->psim_pf_weights || sched->psim_pf_slots > 0) && sched->n_copies == 1) {{
        bool psim_pf_graph = true;
        if (sched->psim_pf_weights && sched->psim_pf_gate > 0) {{
            int64_t moe_batch = -1;
            for (int s = 0; s < sched->n_splits; s++) {{
                for (int j = 0; j < splits[s].graph.n_nodes; j++) {{
                    const ggml_tensor * node = splits[s].graph.nodes[j];
                    if (node->op == GGML_OP_MUL_MAT_ID) {{ moe_batch = std::max(moe_batch, node->src[2]->ne[1]); }}
                }}
            }}
            psim_pf_graph = moe_batch < 0 || moe_batch >= sched->psim_pf_gate;
        }}
        if (psim_pf_graph) {{
            psim_pf_off.resize(sched->n_splits);
            psim_pf_slot.assign(sched->n_splits, -1);
            psim_pf_next.assign(sched->n_splits, -1);
            std::vector<size_t> need(sched->n_backends, 0);
            std::vector<int> staged(sched->n_splits, 0);
            for (int s = 0; s < sched->n_splits; s++) {{
                const int b = splits[s].backend_id;
                if (psim_pf_get(sched, b) == nullptr) {{ continue; }}
                const size_t n = psim_pf_mark(sched, s, psim_pf_off[s], false);
                staged[s] = n > 0;
                need[b] = std::max(need[b], n);
            }}
            std::vector<int> last(sched->n_backends, -1), first(sched->n_backends, -1);
            for (int s = 0; s < sched->n_splits; s++) {{
                const int b = splits[s].backend_id;
                if (!staged[s] || !psim_pf_reserve_slots(sched, b, sched->psim_pf[b], need[b])) {{
                    staged[s] = 0;
                    continue;
                }}
                if (last[b] >= 0) {{ psim_pf_next[last[b]] = s; }} else {{ first[b] = s; }}
                last[b] = s;
            }}
            for (int b = 0; b < sched->n_backends; b++) {{
                if (first[b] >= 0) {{ psim_pf_fire(sched, first[b], psim_pf_off[first[b]], psim_pf_slot); }}
            }}
        }}
    }}
""", after=False),
    Insertion(_SCHED, "struct ggml_tensor * input_cpy = tensor_copy(input, split_backend_id, sched->cur_copy);", f"""\
            {MARK}: a staged input was copied into its slot one split ahead
            if (!psim_pf_slot.empty() && psim_pf_slot[split_id] >= 0 && psim_pf_off[split_id][input_id] != SIZE_MAX) {{
                continue;
            }}
"""),
    Insertion(_SCHED, "if (!sched->callback_eval) {", f"""\
        {MARK}: the split waits for its slot and reads the staged weights there while it is launched
        std::vector<std::pair<ggml_tensor *, std::pair<void *, ggml_backend_buffer_t>>> psim_pf_saved;
        if (!psim_pf_slot.empty() && psim_pf_slot[split_id] >= 0) {{
            psim_pf_dev * d = sched->psim_pf[split_backend_id];
            const int slot = psim_pf_slot[split_id];
            ggml_backend_event_wait(split_backend, d->ready[slot]);
            for (int i = 0; i < split->n_inputs; i++) {{
                if (psim_pf_off[split_id][i] == SIZE_MAX) {{ continue; }}
                ggml_tensor * c = tensor_copy(split->inputs[i], split_backend_id, sched->cur_copy);
                psim_pf_saved.push_back({{ c, {{ c->data, c->buffer }} }});
                c->data = (char *) d->slot_t[slot]->data + psim_pf_off[split_id][i];
                c->buffer = d->bufs[slot];
            }}
        }}
""", after=False),
    Insertion(_SCHED, "// record the event of this split", f"""\
        {MARK}: the launch has read the addresses: restore them, free the slot behind the split, fire the next
        if (!psim_pf_slot.empty() && psim_pf_slot[split_id] >= 0) {{
            for (auto & sv : psim_pf_saved) {{ sv.first->data = sv.second.first; sv.first->buffer = sv.second.second; }}
            psim_pf_dev * d = sched->psim_pf[split_backend_id];
            ggml_backend_event_record(d->freed[psim_pf_slot[split_id]], split_backend);
            if (psim_pf_next[split_id] >= 0) {{
                psim_pf_fire(sched, psim_pf_next[split_id], psim_pf_off[psim_pf_next[split_id]], psim_pf_slot);
            }}
        }}
""", after=False),
    Insertion(_SCHED, "sched->op_offload = op_offload;", f"""\
    {MARK}: the variant, from the environment (llama-bench -pw/-pwg/-pes set it per test)
    {{
        const char * e_w = getenv("GGML_SCHED_PREFETCH_WEIGHTS");
        const char * e_g = getenv("GGML_SCHED_PREFETCH_GATE");
        const char * e_s = getenv("GGML_SCHED_PREFETCH_EXPERT_SLOTS");
        sched->psim_pf_weights = e_w ? atoi(e_w) : 0;
        sched->psim_pf_gate = e_g ? atoi(e_g) : 512;
        sched->psim_pf_slots = e_s ? atoi(e_s) : 0;
        for (int b = 0; b < GGML_SCHED_MAX_BACKENDS; b++) {{ sched->psim_pf[b] = nullptr; }}
    }}
"""),
    Insertion(_SCHED, "ggml_gallocr_free(sched->galloc);", f"""\
    {MARK}: release the staging; only our own copy backend is touched (llama.cpp frees the
    {MARK}: compute backends before the scheduler, after synchronising them)
    for (int b = 0; b < sched->n_backends; b++) {{
        psim_pf_dev * d = sched->psim_pf[b];
        if (d == nullptr) {{ continue; }}
        if (d->copy) {{
            psim_pf_release_slots(nullptr, d);
            for (auto * e : d->ready) {{ ggml_backend_event_free(e); }}
            for (auto * e : d->freed) {{ ggml_backend_event_free(e); }}
            if (d->zeros) {{ ggml_backend_buffer_free(d->zeros); }}
            ggml_backend_free(d->copy);
        }}
        delete d;
        sched->psim_pf[b] = nullptr;
    }}
""", after=False),
    Insertion(_SCHED, "bool ggml_backend_sched_reserve(ggml_backend_sched_t sched, struct ggml_cgraph * measure_graph) {", f"""\
{MARK}: size the slots on the worst-case graph of a reserve (the VRAM is held whether or not a gate skips a graph)
static void psim_pf_size_on_reserve(ggml_backend_sched_t sched) {{
    if (!(sched->psim_pf_weights || sched->psim_pf_slots > 0) || sched->n_copies != 1) {{
        return;
    }}
    std::vector<size_t> need(sched->n_backends, 0), off;
    for (int s = 0; s < sched->n_splits; s++) {{
        const int b = sched->splits[s].backend_id;
        if (psim_pf_get(sched, b) == nullptr) {{ continue; }}
        need[b] = std::max(need[b], psim_pf_mark(sched, s, off, true));
    }}
    for (int b = 0; b < sched->n_backends; b++) {{
        if (need[b] > 0 && sched->psim_pf[b] && !sched->psim_pf[b]->disabled) {{
            psim_pf_reserve_slots(sched, b, sched->psim_pf[b], need[b]);
        }}
    }}
}}

""", after=False),
    Insertion(_SCHED, "ggml_backend_sched_split_graph(sched, measure_graph);", f"""\
    {MARK}: staging slots for the worst-case graph
    psim_pf_size_on_reserve(sched);
""", following="bool ggml_backend_sched_reserve(ggml_backend_sched_t sched, struct ggml_cgraph * measure_graph) {"),
    Insertion(_SCHED, "for (int i = 0; i < sched->n_backends; i++) {", f"""\
    {MARK}: and the copy streams
    for (int b = 0; b < sched->n_backends; b++) {{
        if (sched->psim_pf[b] && sched->psim_pf[b]->copy) {{ ggml_backend_synchronize(sched->psim_pf[b]->copy); }}
    }}
""", following="void ggml_backend_sched_synchronize(ggml_backend_sched_t sched) {", after=False),
)

_BENCH = "tools/llama-bench/llama-bench.cpp"

#: llama-bench's flags, fields and per-test variables (see the module docstring)
PREFETCH_BENCH = (
    Insertion(_BENCH, "static void print_usage(int /* argc */, char ** argv) {", f"""\
{MARK}: -pw / -pwg / -pes lists (the scheduler reads GGML_SCHED_PREFETCH_*, set per test)
static std::vector<int> psim_pw, psim_pwg, psim_pes;
extern "C" size_t psim_prefetch_staging_bytes(void);

""", after=False),
    Insertion(_BENCH, 'printf("  -nopo, --no-op-offload <0|1>                      (default: 0)\\n");', f"""\
    {MARK}: usage
    printf("  -pw, --prefetch-weights <0|1>                     (default: 0) prefetch-sim patch: weight prefetch one split ahead\\n");
    printf("  -pwg, --prefetch-gate <n>                         (default: 512) with -pw 1: off in MoE graphs below n tokens, 0 = ungated\\n");
    printf("  -pes, --prefetch-experts-slots <n>                (default: 0) prefetch-sim patch: expert staging slots\\n");
"""),
    Insertion(_BENCH, '} else if (arg == "-nopo" || arg == "--no-op-offload") {', """\
            } else if (arg == "-pw" || arg == "--prefetch-weights" || arg == "-pwg" || arg == "--prefetch-gate" ||
                       arg == "-pes" || arg == "--prefetch-experts-slots") {  // prefetch-sim prefetch
                if (++i >= argc) {
                    invalid_param = true;
                    break;
                }
                auto p = string_split<int>(argv[i], split_delim);
                auto & dst = (arg == "-pw" || arg == "--prefetch-weights") ? psim_pw
                           : (arg == "-pwg" || arg == "--prefetch-gate") ? psim_pwg : psim_pes;
                for (int v : p) {
                    if (v < 0 || (&dst == &psim_pw && v > 1)) {
                        invalid_param = true;
                    }
                }
                if (invalid_param) {
                    break;
                }
                dst.insert(dst.end(), p.begin(), p.end());
""", after=False),
    Insertion(_BENCH, "uint32_t           fit_min_ctx;", f"""\
    {MARK}
    int                prefetch_weights = 0;
    int                prefetch_gate = 512;
    int                prefetch_expert_slots = 0;
"""),
    Insertion(_BENCH, "uint32_t                 fit_min_ctx;", f"""\
    {MARK}
    int                      prefetch_weights = 0;
    int                      prefetch_gate = 512;
    int                      prefetch_expert_slots = 0;
"""),
    Insertion(_BENCH, "n_depth        = inst.n_depth;", f"""\
        {MARK}
        prefetch_weights      = inst.prefetch_weights;
        prefetch_gate         = inst.prefetch_gate;
        prefetch_expert_slots = inst.prefetch_expert_slots;
"""),
    Insertion(_BENCH, '"n_prompt",       "n_gen",          "n_depth",', """\
            "prefetch_weights", "prefetch_gate", "prefetch_expert_slots",  // prefetch-sim prefetch
""", after=False),
    Insertion(_BENCH, "static field_type get_field_type(const std::string & field) {", f"""\
        {MARK}
        if (field == "prefetch_weights" || field == "prefetch_gate" || field == "prefetch_expert_slots") {{
            return INT;
        }}
"""),
    Insertion(_BENCH, "std::to_string(n_prompt),", """\
                                            std::to_string(prefetch_weights),  // prefetch-sim prefetch
                                            std::to_string(prefetch_gate),
                                            std::to_string(prefetch_expert_slots),
""", after=False),
    Insertion(_BENCH, "static std::string get_field_display_name(const std::string & field) {", f"""\
        {MARK}
        if (field == "prefetch_weights") {{
            return "pw";
        }}
        if (field == "prefetch_gate") {{
            return "pwg";
        }}
        if (field == "prefetch_expert_slots") {{
            return "pes";
        }}
"""),
    Insertion(_BENCH, 'fields.emplace_back("test");', f"""\
        {MARK}: shown when swept or not the default
        if (psim_pw.size() > 1 || (psim_pw.size() == 1 && psim_pw[0] != 0)) {{
            fields.emplace_back("prefetch_weights");
        }}
        if (psim_pwg.size() > 1 || (psim_pwg.size() == 1 && psim_pwg[0] != 512)) {{
            fields.emplace_back("prefetch_gate");
        }}
        if (psim_pes.size() > 1 || (psim_pes.size() == 1 && psim_pes[0] != 0)) {{
            fields.emplace_back("prefetch_expert_slots");
        }}
""", after=False),
    Insertion(_BENCH, "std::vector<cmd_params_instance> params_instances = get_cmd_params_instances(params);", f"""\
    {MARK}: every instance once per (pw, pwg, pes), innermost
    {{
        const std::vector<int> pw  = psim_pw.empty()  ? std::vector<int>{{ 0 }}   : psim_pw;
        const std::vector<int> pwg = psim_pwg.empty() ? std::vector<int>{{ 512 }} : psim_pwg;
        const std::vector<int> pes = psim_pes.empty() ? std::vector<int>{{ 0 }}   : psim_pes;
        std::vector<cmd_params_instance> expanded;
        for (const auto & inst : params_instances) {{
            for (int w : pw) {{
                for (int g : pwg) {{
                    for (int s : pes) {{
                        cmd_params_instance e = inst;
                        e.prefetch_weights = w;
                        e.prefetch_gate = g;
                        e.prefetch_expert_slots = s;
                        expanded.push_back(e);
                    }}
                }}
            }}
        }}
        params_instances.swap(expanded);
    }}
"""),
    Insertion(_BENCH, "llama_context * ctx = llama_init_from_model(lmodel, cparams);", f"""\
        {MARK}: the variant of this test, read by ggml_backend_sched_new
        setenv("GGML_SCHED_PREFETCH_WEIGHTS", std::to_string(inst.prefetch_weights).c_str(), 1);
        setenv("GGML_SCHED_PREFETCH_GATE", std::to_string(inst.prefetch_gate).c_str(), 1);
        setenv("GGML_SCHED_PREFETCH_EXPERT_SLOTS", std::to_string(inst.prefetch_expert_slots).c_str(), 1);
""", after=False),
    Insertion(_BENCH, "test t(inst, lmodel, ctx);", f"""\
        {MARK}: VRAM after the context's reservation
        {{
            size_t psim_free = 0, psim_total = 0;
            for (size_t i = 0; i < ggml_backend_dev_count(); i++) {{
                ggml_backend_dev_t d = ggml_backend_dev_get(i);
                if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU) {{
                    ggml_backend_dev_memory(d, &psim_free, &psim_total);
                    break;
                }}
            }}
            fprintf(stderr, "prefetch-sim vram: model=%s test=%d/%d/%d ub=%d pw=%d pwg=%d pes=%d used_mib=%.1f staging_mib=%.1f\\n",
                    inst.model.c_str(), inst.n_prompt, inst.n_gen, inst.n_depth, inst.n_ubatch, inst.prefetch_weights,
                    inst.prefetch_gate, inst.prefetch_expert_slots, (psim_total - psim_free) / 1048576.0,
                    psim_prefetch_staging_bytes() / 1048576.0);
        }}
""", after=False),
)

_DECODE_SRC = Path(__file__).with_name("src") / "psim-decode.cpp"

#: the output identity program and its target (``calibrate/llamacpp/src/psim-decode.cpp``)
PREFETCH_DECODE = (
    NewFile("tools/llama-bench/psim-decode.cpp", _DECODE_SRC.read_text()),
    Insertion("tools/llama-bench/CMakeLists.txt", "target_compile_features(${TARGET} PRIVATE cxx_std_17)", """\
# prefetch-sim prefetch: the output identity check (calibrate/llamacpp/src/psim-decode.cpp)
add_executable(psim-decode psim-decode.cpp)
target_link_libraries(psim-decode PRIVATE llama-common llama ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(psim-decode PRIVATE cxx_std_17)
"""),
)

#: the three parts, applied as one patch named ``prefetch``
PREFETCH = PREFETCH_SCHED + PREFETCH_BENCH + PREFETCH_DECODE
