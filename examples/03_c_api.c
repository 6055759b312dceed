/* 03: attention from C99 through the C API (include/tileattn/tileattn.h).
 *
 * Q, K and V in [batch, seq, heads, dim] layout (bshd), a causal mask with
 * more keys than queries (so causal aligns bottom-right), and the result
 * checked against a plain double-precision attention written out below.
 * Also shows error handling: a status code plus a per-thread message.
 *
 * Build: cc 03_c_api.c $(pkg-config --cflags --libs tileattn) -lm
 * (PKG_CONFIG_PATH=P/lib/pkgconfig for a package installed with
 * `cmake --install build --prefix P`; run with LD_LIBRARY_PATH=P/lib when P/lib
 * is not on the loader's path). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tileattn/tileattn.h"

enum { BATCH = 1, HEADS = 4, SEQ_Q = 37, SEQ_K = 53, DIM = 48 };

/* Element (b, h, i, d) of a bshd tensor with `heads` heads and `rows` rows. */
static size_t bshd(int b, int h, int i, int d, int heads, int rows) {
  return (((size_t)b * rows + i) * heads + h) * DIM + d;
}

/* Standard attention with every intermediate kept in double, or rounded to
   float when `in_float` (the same-precision naive baseline of the accuracy rule). */
static void attention_cpu(const float* q, const float* k, const float* v, double* o, int in_float) {
  double scores[SEQ_K];
  const double scale = 1.0 / sqrt((double)DIM);
  for (int h = 0; h < HEADS; ++h) {
    for (int i = 0; i < SEQ_Q; ++i) {
      const int last_key = i + (SEQ_K - SEQ_Q); /* causal, aligned bottom-right */
      double max = -INFINITY, sum = 0;
      for (int j = 0; j <= last_key; ++j) {
        double s = 0;
        for (int d = 0; d < DIM; ++d) {
          s += (double)q[bshd(0, h, i, d, HEADS, SEQ_Q)] * k[bshd(0, h, j, d, HEADS, SEQ_K)];
          if (in_float) s = (float)s;
        }
        scores[j] = in_float ? (float)(s * scale) : s * scale;
        if (scores[j] > max) max = scores[j];
      }
      for (int j = 0; j <= last_key; ++j) {
        scores[j] = in_float ? (float)exp(scores[j] - max) : exp(scores[j] - max);
        sum += scores[j];
        if (in_float) sum = (float)sum;
      }
      for (int d = 0; d < DIM; ++d) {
        double acc = 0;
        for (int j = 0; j <= last_key; ++j) {
          acc += scores[j] / sum * v[bshd(0, h, j, d, HEADS, SEQ_K)];
          if (in_float) acc = (float)acc;
        }
        o[bshd(0, h, i, d, HEADS, SEQ_Q)] = in_float ? (float)acc : acc;
      }
    }
  }
}

static int check(tileattn_status status, const char* what) {
  if (status == TILEATTN_OK) return 1;
  fprintf(stderr, "%s failed (%s): %s\n", what, tileattn_status_string(status), tileattn_last_error());
  return 0;
}

int main(void) {
  static float q[BATCH * SEQ_Q * HEADS * DIM], k[BATCH * SEQ_K * HEADS * DIM], v[BATCH * SEQ_K * HEADS * DIM];
  static float o[BATCH * SEQ_Q * HEADS * DIM];
  static double exact[BATCH * SEQ_Q * HEADS * DIM], naive[BATCH * SEQ_Q * HEADS * DIM];
  int32_t major, minor, patch;
  tileattn_forward_args args;
  tileattn_status status;
  double error = 0, naive_error = 0, tolerance;
  size_t i;

  /* The headers and the loaded library should agree. */
  if (!check(tileattn_get_version(&major, &minor, &patch), "tileattn_get_version")) return 1;
  printf("tileattn %s (headers %d.%d.%d)\n", tileattn_version_string(), TILEATTN_VERSION_MAJOR,
         TILEATTN_VERSION_MINOR, TILEATTN_VERSION_PATCH);
  if (major != TILEATTN_VERSION_MAJOR) return 1;

  srand(7);
  for (i = 0; i < sizeof q / sizeof q[0]; ++i) q[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;
  for (i = 0; i < sizeof k / sizeof k[0]; ++i) k[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;
  for (i = 0; i < sizeof v / sizeof v[0]; ++i) v[i] = 2.0f * rand() / (float)RAND_MAX - 1.0f;

  /* init sets struct_size and every default (no mask, scale 1/sqrt(dim), ...). */
  if (!check(tileattn_forward_args_init(&args), "tileattn_forward_args_init")) return 1;
  args.batch = BATCH;
  args.heads = HEADS;
  args.kv_heads = HEADS;
  args.seqlen_q = SEQ_Q;
  args.seqlen_k = SEQ_K;
  args.head_dim = DIM;
  args.dtype = TILEATTN_F32;
  args.causal = 1;
  args.q.data = q;
  args.k.data = k;
  args.v.data = v;
  args.o.data = o;
  /* Strides are in elements, in [batch, head, row, dim] order whatever the layout. */
  if (!check(tileattn_dense_strides(TILEATTN_LAYOUT_BSHD, BATCH, HEADS, SEQ_Q, DIM, args.q.stride), "strides") ||
      !check(tileattn_dense_strides(TILEATTN_LAYOUT_BSHD, BATCH, HEADS, SEQ_K, DIM, args.k.stride), "strides"))
    return 1;
  for (i = 0; i < 4; ++i) {
    args.v.stride[i] = args.k.stride[i];
    args.o.stride[i] = args.q.stride[i];
  }
  if (!check(tileattn_forward(&args), "tileattn_forward")) return 1;

  attention_cpu(q, k, v, exact, 0);
  attention_cpu(q, k, v, naive, 1);
  for (i = 0; i < sizeof o / sizeof o[0]; ++i) {
    if (fabs(o[i] - exact[i]) > error) error = fabs(o[i] - exact[i]);
    if (fabs(naive[i] - exact[i]) > naive_error) naive_error = fabs(naive[i] - exact[i]);
  }
  tolerance = 2 * naive_error + 0.25 * ldexp(1.0, -23);
  printf("max |O - O_double| = %.3g (naive float: %.3g, tolerance %.3g)\n", error, naive_error, tolerance);
  if (!(error <= tolerance)) {
    fprintf(stderr, "FAILED: error above tolerance\n");
    return 1;
  }

  /* A bad argument: the call fails, writes nothing, and says why. */
  args.head_dim = 300;
  status = tileattn_forward(&args);
  printf("head_dim 300 -> %s: %s\n", tileattn_status_string(status), tileattn_last_error());
  if (status != TILEATTN_INVALID_ARGUMENT) return 1;
  printf("ok\n");
  return 0;
}
