// decode at depth with llama.cpp's library: fill the cache with `depth` random tokens (batches of 512, fill
// threads), then time n_gen single-token decodes on 1 thread: process CPU time and wall time per token.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: model depth n_gen fa(-1 auto/0/1) fill_threads\n"); return 1; }
    const char *path = argv[1]; int depth = atoi(argv[2]), n_gen = atoi(argv[3]), fa = atoi(argv[4]);
    int fill_th = atoi(argv[5]);
    llama_log_set(NULL, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = depth + n_gen + 16; cp.n_batch = 512; cp.n_ubatch = 512;
    cp.n_threads = 1; cp.n_threads_batch = fill_th;
    cp.flash_attn_type = (enum llama_flash_attn_type)fa;  // -1 auto (llama-bench's default), 0 off, 1 on
    cp.no_perf = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    srand(1);
    llama_token *tok = malloc(sizeof(llama_token) * 512);
    double f0 = now(CLOCK_MONOTONIC);
    for (int p = 0; p < depth; p += 512) {
        int n = depth - p < 512 ? depth - p : 512;
        for (int i = 0; i < n; i++) tok[i] = rand() % nv;
        if (llama_decode(ctx, llama_batch_get_one(tok, n))) { fprintf(stderr, "fill decode failed\n"); return 1; }
    }
    double fill = now(CLOCK_MONOTONIC) - f0;
    llama_set_n_threads(ctx, 1, 1);
    tok[0] = rand() % nv;
    llama_decode(ctx, llama_batch_get_one(tok, 1));  // warm-up token
    double c0 = now(CLOCK_PROCESS_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    for (int i = 0; i < n_gen; i++) {
        tok[0] = rand() % nv;
        if (llama_decode(ctx, llama_batch_get_one(tok, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    double c = now(CLOCK_PROCESS_CPUTIME_ID) - c0, w = now(CLOCK_MONOTONIC) - w0;
    printf("llama.cpp depth=%d fa=%d n_gen=%d cpu_ms_per_tok=%.3f wall_ms_per_tok=%.3f fill_s=%.1f\n", depth, fa,
           n_gen, c * 1e3 / n_gen, w * 1e3 / n_gen, fill);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
