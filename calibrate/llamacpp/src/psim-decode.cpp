// prefetch-sim prefetch: output identity check (the project's own program, built beside llama-bench).
//
// Prefills a fixed pseudo-random prompt of -p tokens (every token's logits requested), then decodes
// -n tokens greedily, one at a time. Prints one JSON line: the generated token ids, an FNV-1a 64
// hash of the prompt's logits and one per decoding step. Run it with the scheduler's prefetch
// variables (GGML_SCHED_PREFETCH_WEIGHTS / _GATE / _EXPERT_SLOTS) off and on and compare: the
// prefetch must not change a bit. A synthetic model may repeat one token, so the logits' hashes,
// not the tokens, are the check.
//
// usage: psim-decode -m MODEL [-ngl N] [-ncmoe N] [-lm none|mmap] [-b N] [-ub N] [-p N] [-n N] [-fa 0|1] [--seed S]

#include "common.h"
#include "llama.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static uint64_t fnv1a(const void * data, size_t n, uint64_t h = 1469598103934665603ULL) {
    const uint8_t * p = (const uint8_t *) data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int usage(const char * argv0, const char * why) {
    fprintf(stderr, "psim-decode: %s\nusage: %s -m MODEL [-ngl N] [-ncmoe N] [-lm none|mmap] [-b N] [-ub N] [-p N] [-n N] [-fa 0|1] [--seed S]\n",
            why, argv0);
    return 2;
}

int main(int argc, char ** argv) {
    std::string model;
    int ngl = 99, ncmoe = 0, n_batch = 2048, n_ubatch = 512, n_prompt = 512, n_gen = 500, fa = 1;
    unsigned seed = 0;
    std::string lm = "none";
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            return usage(argv[0], ("missing value of " + a).c_str());
        }
        const char * v = argv[++i];
        if (a == "-m") { model = v; }
        else if (a == "-ngl") { ngl = atoi(v); }
        else if (a == "-ncmoe") { ncmoe = atoi(v); }
        else if (a == "-lm") { lm = v; }
        else if (a == "-b") { n_batch = atoi(v); }
        else if (a == "-ub") { n_ubatch = atoi(v); }
        else if (a == "-p") { n_prompt = atoi(v); }
        else if (a == "-n") { n_gen = atoi(v); }
        else if (a == "-fa") { fa = atoi(v); }
        else if (a == "--seed") { seed = (unsigned) strtoul(v, nullptr, 10); }
        else { return usage(argv[0], ("unknown flag " + a).c_str()); }
    }
    if (model.empty() || n_prompt < 1 || n_gen < 0 || n_ubatch < 1 || n_batch < 1 || (lm != "none" && lm != "mmap")) {
        return usage(argv[0], "bad arguments");
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    mp.load_mode = lm == "none" ? LLAMA_LOAD_MODE_NONE : LLAMA_LOAD_MODE_MMAP;
    std::vector<std::string> patterns;
    std::vector<llama_model_tensor_buft_override> ov;
    patterns.reserve(ncmoe > 0 ? ncmoe : 0);
    for (int i = 0; i < ncmoe; i++) {
        patterns.push_back(llm_ffn_block_regex(i, LLM_FFN_EXPS_REGEX));
        ov.push_back({ patterns.back().c_str(), ggml_backend_cpu_buffer_type() });
    }
    ov.push_back({ nullptr, nullptr });
    if (ncmoe > 0) {
        mp.tensor_buft_overrides = ov.data();
    }
    llama_model * lmodel = llama_model_load_from_file(model.c_str(), mp);
    if (lmodel == nullptr) {
        fprintf(stderr, "psim-decode: cannot load %s\n", model.c_str());
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_prompt + n_gen + 16;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_ubatch;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(lmodel, cp);
    if (ctx == nullptr) {
        fprintf(stderr, "psim-decode: cannot create a context\n");
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(lmodel);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> tok(0, n_vocab - 1);
    uint64_t h_prompt = 1469598103934665603ULL;
    for (int p0 = 0; p0 < n_prompt; p0 += n_batch) {
        const int n = std::min(n_batch, n_prompt - p0);
        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = tok(rng);
            batch.pos[i] = p0 + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "psim-decode: prefill failed at %d\n", p0);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            h_prompt = fnv1a(llama_get_logits_ith(ctx, i), sizeof(float) * n_vocab, h_prompt);
        }
        llama_batch_free(batch);
    }
    std::vector<int> tokens;
    std::vector<uint64_t> steps;
    const float * logits = llama_get_logits_ith(ctx, -1);
    for (int s = 0; s < n_gen; s++) {
        int best = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[best]) { best = v; }
        }
        tokens.push_back(best);
        llama_token t = best;
        if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
            fprintf(stderr, "psim-decode: decode failed at step %d\n", s);
            return 1;
        }
        logits = llama_get_logits_ith(ctx, -1);
        steps.push_back(fnv1a(logits, sizeof(float) * n_vocab));
    }
    const char * e_w = getenv("GGML_SCHED_PREFETCH_WEIGHTS");
    const char * e_g = getenv("GGML_SCHED_PREFETCH_GATE");
    const char * e_s = getenv("GGML_SCHED_PREFETCH_EXPERT_SLOTS");
    printf("{\"model\": \"%s\", \"ngl\": %d, \"ncmoe\": %d, \"lm\": \"%s\", \"n_batch\": %d, \"n_ubatch\": %d, \"n_prompt\": %d, "
           "\"n_gen\": %d, \"fa\": %d, \"seed\": %u, \"pw\": \"%s\", \"pwg\": \"%s\", \"pes\": \"%s\", \"hash_prompt\": \"%016llx\", \"tokens\": [",
           model.c_str(), ngl, ncmoe, lm.c_str(), n_batch, n_ubatch, n_prompt, n_gen, fa, seed, e_w ? e_w : "", e_g ? e_g : "",
           e_s ? e_s : "", (unsigned long long) h_prompt);
    for (size_t i = 0; i < tokens.size(); i++) { printf("%s%d", i ? ", " : "", tokens[i]); }
    printf("], \"steps\": [");
    for (size_t i = 0; i < steps.size(); i++) { printf("%s\"%016llx\"", i ? ", " : "", (unsigned long long) steps[i]); }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(lmodel);
    llama_backend_free();
    return 0;
}
