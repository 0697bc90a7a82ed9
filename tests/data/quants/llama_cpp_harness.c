#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-quants.h"
typedef size_t (*qfn)(const float *, void *, int64_t, int64_t, const float *);
static size_t TS[40] = {0}; static int BS[40] = {0};
int main(int argc, char ** argv) {
    int type = atoi(argv[1]); long nrow = atol(argv[2]); long n = atol(argv[3]);
    float * x = malloc(nrow*n*4); FILE * f = fopen(argv[4], "rb"); fread(x, 4, nrow*n, f); fclose(f);
    float * im = NULL;
    if (argc > 6) { im = malloc(n*4); f = fopen(argv[6], "rb"); fread(im, 4, n, f); fclose(f); }
    qfn fn = NULL;
    switch (type) {
        case GGML_TYPE_Q4_0: fn = quantize_q4_0; break;
        case GGML_TYPE_Q4_1: fn = quantize_q4_1; break;
        case GGML_TYPE_Q5_0: fn = quantize_q5_0; break;
        case GGML_TYPE_Q5_1: fn = quantize_q5_1; break;
        case GGML_TYPE_Q8_0: fn = quantize_q8_0; break;
        case GGML_TYPE_Q2_K: fn = quantize_q2_K; break;
        case GGML_TYPE_Q3_K: fn = quantize_q3_K; break;
        case GGML_TYPE_Q4_K: fn = quantize_q4_K; break;
        case GGML_TYPE_Q5_K: fn = quantize_q5_K; break;
        case GGML_TYPE_Q6_K: fn = quantize_q6_K; break;
        case GGML_TYPE_IQ4_NL: fn = quantize_iq4_nl; break;
        case GGML_TYPE_IQ4_XS: fn = quantize_iq4_xs; break;
        case GGML_TYPE_TQ1_0: fn = quantize_tq1_0; break;
        case GGML_TYPE_TQ2_0: fn = quantize_tq2_0; break;
        case GGML_TYPE_MXFP4: fn = quantize_mxfp4; break;
        case GGML_TYPE_IQ2_XXS: iq2xs_init_impl(GGML_TYPE_IQ2_XXS); fn = quantize_iq2_xxs; break;
        case GGML_TYPE_IQ2_XS: iq2xs_init_impl(GGML_TYPE_IQ2_XS); fn = quantize_iq2_xs; break;
        case GGML_TYPE_IQ2_S: iq2xs_init_impl(GGML_TYPE_IQ2_S); fn = quantize_iq2_s; break;
        case GGML_TYPE_IQ1_S: iq2xs_init_impl(GGML_TYPE_IQ1_S); fn = quantize_iq1_s; break;
        case GGML_TYPE_IQ1_M: iq2xs_init_impl(GGML_TYPE_IQ1_M); fn = quantize_iq1_m; break;
        case GGML_TYPE_IQ3_XXS: iq3xs_init_impl(256); fn = quantize_iq3_xxs; break;
        case GGML_TYPE_IQ3_S: iq3xs_init_impl(512); fn = quantize_iq3_s; break;
        case GGML_TYPE_Q8_K: {
            void * out = calloc(292 * nrow * n / 256, 1);
            quantize_row_q8_K_ref(x, out, nrow*n);
            f = fopen(argv[5], "wb"); fwrite(out, 1, 292*nrow*n/256, f); fclose(f); return 0; }
        case GGML_TYPE_Q8_1: {
            void * out = calloc(36 * nrow * n / 32, 1);
            quantize_row_q8_1_ref(x, out, nrow*n);
            f = fopen(argv[5], "wb"); fwrite(out, 1, 36*nrow*n/32, f); fclose(f); return 0; }
        default: fprintf(stderr, "type?\n"); return 1;
    }
    size_t big = nrow * n * 4;
    void * out = calloc(big, 1);
    size_t sz = fn(x, out, nrow, n, im);
    f = fopen(argv[5], "wb"); fwrite(out, 1, sz, f); fclose(f);
    return 0;
}
