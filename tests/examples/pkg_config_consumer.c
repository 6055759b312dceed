/* Built by the pkg-config test against an installed tileattn:
 *   cc -std=c99 pkg_config_consumer.c $(pkg-config --cflags --libs tileattn)
 * Computes one attention problem through the C API and writes its sizes,
 * inputs and output to a file, which check_c_result recomputes through the
 * C++ API and compares bit for bit. */
#include <stdio.h>
#include <stdlib.h>

#include "tileattn/tileattn.h"

enum { BATCH = 2, HEADS = 6, KV_HEADS = 2, SEQ_Q = 19, SEQ_K = 41, DIM = 96, CAUSAL = 1 };
#define Q_SIZE (BATCH * HEADS * SEQ_Q * DIM)
#define KV_SIZE (BATCH * KV_HEADS * SEQ_K * DIM)

static float q[Q_SIZE], k[KV_SIZE], v[KV_SIZE], o[Q_SIZE];

int main(int argc, char** argv) {
  const int64_t header[7] = {BATCH, HEADS, KV_HEADS, SEQ_Q, SEQ_K, DIM, CAUSAL};
  tileattn_forward_args args;
  FILE* out;
  int i, ok;
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
    return 2;
  }
  srand(11);
  for (i = 0; i < Q_SIZE; ++i) q[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;
  for (i = 0; i < KV_SIZE; ++i) k[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;
  for (i = 0; i < KV_SIZE; ++i) v[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;

  /* The init macros take any pointer to the struct (they pass sizeof its type): a void* and NULL too. */
  {
    void* untyped = &args;
    if (tileattn_forward_args_init(untyped) != TILEATTN_OK || args.struct_size != sizeof args ||
        tileattn_forward_args_init(NULL) != TILEATTN_INVALID_ARGUMENT) {
      fprintf(stderr, "init through a void* or NULL: %s\n", tileattn_last_error());
      return 1;
    }
  }
  tileattn_forward_args_init(&args);
  args.batch = BATCH;
  args.heads = HEADS;
  args.kv_heads = KV_HEADS;
  args.seqlen_q = SEQ_Q;
  args.seqlen_k = SEQ_K;
  args.head_dim = DIM;
  args.causal = CAUSAL;
  args.q.data = q;
  args.k.data = k;
  args.v.data = v;
  args.o.data = o;
  tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, BATCH, HEADS, SEQ_Q, DIM, args.q.stride);
  tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, BATCH, KV_HEADS, SEQ_K, DIM, args.k.stride);
  tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, BATCH, KV_HEADS, SEQ_K, DIM, args.v.stride);
  tileattn_dense_strides(TILEATTN_LAYOUT_BHSD, BATCH, HEADS, SEQ_Q, DIM, args.o.stride);
  if (tileattn_forward(&args) != TILEATTN_OK) {
    fprintf(stderr, "tileattn_forward: %s\n", tileattn_last_error());
    return 1;
  }
  out = fopen(argv[1], "wb");
  if (!out) {
    perror(argv[1]);
    return 1;
  }
  ok = fwrite(header, sizeof header, 1, out) == 1 && fwrite(q, sizeof q, 1, out) == 1 &&
       fwrite(k, sizeof k, 1, out) == 1 && fwrite(v, sizeof v, 1, out) == 1 &&
       fwrite(o, sizeof o, 1, out) == 1;
  if (fclose(out) != 0 || !ok) {
    fprintf(stderr, "%s: write failed\n", argv[1]);
    return 1;
  }
  printf("tileattn %s via pkg-config: wrote %s\n", tileattn_version_string(), argv[1]);
  return 0;
}
