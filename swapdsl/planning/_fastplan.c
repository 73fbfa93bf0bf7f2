/* The optimiser's inner loop in C: the swap planner, the simulator and the schedule decoder that
   compiled.Evaluator calls, one call each.

   plan() makes exactly the program that reference.plan_swaps_reference makes, and simulate() times it
   exactly as simulate.simulate does; tests/test_fastplan.py holds both to those references on random
   graphs, caps and policies. The program is a list of records (bucket, kind, tensor, offset, before):
   bucket b holds what is issued after the op at schedule position b - 1, and kinds order a bucket as
   the reference does (the run, then swap-outs, frees and swap-ins).

   Until this file the same algorithm was numba-compiled: here the simulator runs 1.6x and the planner
   1.1-1.2x faster on the LSTM's plan, with no compile on first use. Arrays come in through the buffer
   protocol, so building this needs no NumPy headers. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;
#define INF ((i64)1 << 60)
/* Instruction kinds, in the order a program issues those that follow the same op: plan/program.py's
   InstrKind (a test holds the two together through INSTR_KINDS below). */
enum { LAUNCH = 0, SWAP_OUT = 1, FREE = 2, SWAP_IN = 3 };
/* What plan() returns; planning/compiled.py's Status names the same values. */
enum { DONE = 0, NO_ROOM_FIXED = 1, NO_ROOM_TENSOR = 2, OUT_OF_RECORDS = 3, OUT_OF_MEMORY = -1 };
/* The policy crosses as int64 fields in this order (POLICY_FIELDS), each coded as in POLICY_CODES. */
enum { P_VICTIM, P_PREFETCH, P_OFFLOAD, P_OUTPUTS, P_RESERVE, P_HORIZON, P_FIELDS };
enum { VICTIM_LRU, VICTIM_BELADY };
enum { PREFETCH_NONE, PREFETCH_EARLIEST, PREFETCH_AHEAD };
enum { OUTPUTS_OLDEST, OUTPUTS_NEWEST, OUTPUTS_NEWEST_BACKWARD };
static inline i64 min64(i64 a, i64 b) { return a < b ? a : b; }
static inline i64 max64(i64 a, i64 b) { return a > b ? a : b; }
static inline double dmax(double a, double b) { return a > b ? a : b; }

/* -- when each byte fell free: segments tiling [0, top) in offset order, bucket b pointing at the
   segment that holds byte b << shift */

#define BUCKETS 4096
typedef struct { i64 lo, hi, nx, pv; } Seg;
typedef struct { Seg *s; double *val; i64 *bucket; int shift; i64 n, room; } Segs;

static int segs_init(Segs *g, i64 top, i64 room, double first) {
    g->room = room < 2 ? 2 : room;
    g->s = malloc(sizeof(Seg) * g->room);
    g->val = malloc(sizeof(double) * g->room);
    g->bucket = calloc(BUCKETS + 1, sizeof(i64));
    if (!g->s || !g->val || !g->bucket) return -1;
    g->s[0] = (Seg){0, top > 1 ? top : 1, -1, -1};
    g->val[0] = first;
    g->n = 1;
    g->shift = 8;
    while (((i64)BUCKETS << g->shift) < top) g->shift++;
    return 0;
}

static void segs_free(Segs *g) { free(g->s); free(g->val); free(g->bucket); }

/* *p reallocated to `bytes`: 0, or -1 (*p unchanged) when out of memory. */
static int grow(void **p, size_t bytes) {
    void *q = realloc(*p, bytes);
    if (!q) return -1;
    *p = q;
    return 0;
}

/* Room for two more segments (an assignment makes at most two). */
static int segs_reserve(Segs *g) {
    if (g->n + 2 <= g->room) return 0;
    i64 room = 2 * g->room;
    if (grow((void **)&g->s, sizeof(Seg) * room) < 0 || grow((void **)&g->val, sizeof(double) * room) < 0)
        return -1;
    g->room = room;
    return 0;
}

static inline i64 first_bucket(i64 b, int shift) { return (b + ((i64)1 << shift) - 1) >> shift; }

static inline i64 seg_find(const Segs *g, i64 lo) {
    i64 x = g->bucket[lo >> g->shift];
    while (g->s[x].hi <= lo) x = g->s[x].nx;
    return x;
}

static inline double seg_max(const Segs *g, i64 lo, i64 hi) {
    i64 x = seg_find(g, lo);
    double most = -INFINITY;
    while (x >= 0 && g->s[x].lo < hi) {
        if (g->val[x] > most) most = g->val[x];
        x = g->s[x].nx;
    }
    return most;
}

static inline void seg_point(Segs *g, i64 lo, i64 hi, i64 x) {
    for (i64 b = first_bucket(lo, g->shift), e = first_bucket(hi, g->shift); b < e; b++) g->bucket[b] = x;
}

static inline void seg_new(Segs *g, i64 n, i64 lo, i64 hi, double v, i64 prev, i64 nxt) {
    g->s[n] = (Seg){lo, hi, nxt, prev};
    g->val[n] = v;
    if (prev >= 0) g->s[prev].nx = n;
    if (nxt >= 0) g->s[nxt].pv = n;
}

/* [lo, hi) now holds v (room for two more segments was made). A segment cut in three keeps its id for
   the side with more buckets. */
static void seg_assign(Segs *g, i64 lo, i64 hi, double v) {
    Seg *s = g->s;
    int shift = g->shift;
    i64 n = g->n, x = seg_find(g, lo);
    i64 x_lo = s[x].lo, x_hi = s[x].hi;
    double x_v = g->val[x];
    if (x_hi >= hi) {
        if (x_lo == lo && x_hi == hi) {
            g->val[x] = v;
            return;
        }
        i64 left = first_bucket(lo, shift) - first_bucket(x_lo, shift);
        i64 right = first_bucket(x_hi, shift) - first_bucket(hi, shift);
        if (x_lo < lo && (x_hi == hi || left >= right)) {
            s[x].hi = lo;
            seg_new(g, n, lo, hi, v, x, s[x].nx);
            seg_point(g, lo, hi, n);
            g->n = n + 1;
            if (x_hi > hi) {
                seg_new(g, n + 1, hi, x_hi, x_v, n, s[n].nx);
                seg_point(g, hi, x_hi, n + 1);
                g->n = n + 2;
            }
            return;
        }
        s[x].lo = hi;
        seg_new(g, n, lo, hi, v, s[x].pv, x);
        seg_point(g, lo, hi, n);
        g->n = n + 1;
        if (x_lo < lo) {
            seg_new(g, n + 1, x_lo, lo, x_v, s[n].pv, n);
            seg_point(g, x_lo, lo, n + 1);
            g->n = n + 2;
        }
        return;
    }
    i64 y = s[x].nx, y_next;
    while (s[y].hi <= hi && s[y].nx >= 0) y = s[y].nx;
    if (s[y].hi <= hi) {
        y_next = -1;
    } else {
        s[y].lo = max64(s[y].lo, hi);
        y_next = y;
    }
    if (x_lo < lo) {
        s[x].hi = lo;
        seg_new(g, n, lo, hi, v, x, y_next);
    } else {
        seg_new(g, n, lo, hi, v, s[x].pv, y_next);
    }
    seg_point(g, lo, hi, n);
    g->n = n + 1;
}

/* -- the planner's state.

   Choosing a place (fit) ranks the places at the start or the end of each gap that holds the size by
   since when all their bytes are free (longest first, or freed last for "newest" outputs), then the
   smallest gap, then the lowest offset; the gap above the last tenant is used, at its start, only when
   no other gap holds the size. A ranking (below) keeps the best place for a (size, direction) up to
   date as gaps change. A gap knows, for two sizes, since when the first and the last `size` bytes are
   free (KNOW0 for its start, KNOW1 for its end: a (size, since) pair for the size asked last, then one,
   KNOW_OLD further on, for the size before), so most look-ups never reach the segments; it keeps what
   it knows of an end while that end stays and the gap is no shorter. GLB and GUB bound the positions
   at which a gap's bytes fell free, so a look at every gap skips one whose bound is worse than the best
   place found. A gap cut by a tenant leaves both parts (and the tenant, in nb) the whole gap's bounds;
   gaps joined by a tenant's leaving take the least and the most of the three.

   Arena node m is row a[m], one cache line (window() walks them): NX/PV link nodes in offset order,
   OFF/END/TEN its tenant, GPOS the slot of the gap before it in the set of gaps, RUN_AT/RUN_END serve
   window(); nb[2m], nb[2m + 1] bound its bytes' free positions. Node HEAD = n_t starts the list, TOP =
   n_t + 1 ends it; `spare` is a stack of unused nodes. aux[q] is slot q of the (unordered) gap set: the
   node after it (GS), its bytes (GLO, GHI), their bounds (GLB, GUB) and what it knows of its ends
   (KNOW0, KNOW1). tr[t] is tensor t's row. */

enum { NX, PV, OFF, END, TEN, GPOS, RUN_AT, RUN_END, A_COLS }; /* (a cache line a row) */
enum { GLO, GHI, GS, GLB, GUB, KNOW0, KNOW1 = 7, KNOW_OLD = 4, AUX_ROWS = 13 };
/* tensor t's row: where it lives (-1: not on the device) and the rest of its state, positions and
   indices as int32: 88 bytes, against 192 for the 24 int64 columns it replaced (the LSTM's search
   candidates 4% faster) */
typedef struct {
    i64 where, size, next_use;
    int32_t mark, resident, is_out, queued, last, next_i, use_end, last_use, node, rk_next, rk_prev, rk_key,
        early_rec, host_at, released;
    uint8_t fixed, pinned, host, write_back;
} Tensor;

/* With many gaps, fit() reads the best place for a (size, direction) off a ranking: a tournament tree
   over the gap slots: node cap + q names slot q if its gap takes the size and is not the one above
   the last tenant (else slot cap, none, ranked last), node i < cap the better of nodes 2i and 2i + 1. A
   slot's place changes only when its gap does (a tenant's leaving changes the bytes of the gap it
   joins, and that gap is put again), so the planner logs each slot it changes and a ranking replays
   the log since it was last asked: a few leaves and their paths to the root. A ranking made anew holds
   bounds (the least key a gap's bytes allow, at its lowest offset: never worse than its place), and a
   bound that leads is made exact. A ranking pays only while its size is asked often: one asked after
   more than gaps / STALE changes is noted again, and that fit looks at every gap, as do fits among
   fewer than rank_gaps gaps (compiled.RANK_GAPS). Measured: below 48 gaps rankings cost more than they
   save on the zoo's smaller graphs; above, the LSTM's search candidates plan 14% faster. */
#define RANKINGS 4
#define STALE 2
#define CHANGES 1024 /* (a power of two) */
typedef struct { i64 key, len, off, stamp, exact; } Place;
typedef struct {
    i64 size, sign, cap, room; /* cap leaves (0: noted, not made), room for more */
    i64 seen, used;            /* changes applied; when last asked */
    i64 *node;                 /* node[1 .. 2 cap): winners (slots) */
    Place *leaf;               /* each slot's place or bound, and when it was last replayed */
} Ranking;

typedef struct {
    i64 n_t, n_ops, kh_w, kh_row[4], rank_gaps;
    i64 *a, *nb, *aux, *kh, *found, *spare, *use_pos; /* use_pos lies after found's n_t rows */
    Tensor *tr;
    i64 tenants, gaps, free_nodes, bytes, early_limit, scans;
    Segs f;
    i64 *hk, *ht, hp_n, hp_room; /* heap of (next use, tensor) waiting on the host */
    i64 *recs, nrec, rec_room;   /* records: bucket, kind, tensor, offset, before */
    Ranking rk[RANKINGS];
    i64 changed[CHANGES], clock, asks; /* gap slots changed (a ring), changes so far, fits so far */
} Planner;

#define A(m, c) P->a[(m) * A_COLS + (c)]
#define AUX(field, q) P->aux[(q) * AUX_ROWS + (field)]
#define TR(t, c) P->tr[t].c
#define KH(r, w) P->kh[P->kh_row[r] + (w)]

static inline void record(Planner *P, i64 bucket, i64 kind, i64 t, i64 offset, i64 before) {
    i64 *r = P->recs + 5 * P->nrec++;
    r[0] = bucket, r[1] = kind, r[2] = t, r[3] = offset, r[4] = before;
}

/* the gap set */

static inline void changed(Planner *P, i64 q) { P->changed[P->clock++ & (CHANGES - 1)] = q; }

static inline i64 gap_put(Planner *P, i64 g, i64 lo, i64 hi, i64 lb, i64 ub) {
    i64 q = A(g, GPOS);
    if (q < 0) {
        q = P->gaps++;
        AUX(GS, q) = g;
        A(g, GPOS) = q;
        AUX(KNOW0, q) = AUX(KNOW0 + KNOW_OLD, q) = AUX(KNOW1, q) = AUX(KNOW1 + KNOW_OLD, q) = -1;
    }
    AUX(GLO, q) = lo, AUX(GHI, q) = hi, AUX(GLB, q) = lb, AUX(GUB, q) = ub;
    changed(P, q);
    return q;
}

static inline void know(Planner *P, i64 src, i64 dst, int row, i64 length) {
    for (int k = row; k <= row + KNOW_OLD; k += KNOW_OLD) {
        i64 size = AUX(k, src) <= length ? AUX(k, src) : -1, since = AUX(k + 1, src);
        AUX(k, dst) = size, AUX(k + 1, dst) = since;
    }
}

static inline i64 since_of(Planner *P, i64 q, int row, i64 size, i64 lo) {
    if (AUX(row, q) == size) return AUX(row + 1, q);
    i64 since = AUX(row + KNOW_OLD + 1, q);
    if (AUX(row + KNOW_OLD, q) != size) since = (i64)seg_max(&P->f, lo, lo + size);
    AUX(row + KNOW_OLD, q) = AUX(row, q), AUX(row + KNOW_OLD + 1, q) = AUX(row + 1, q);
    AUX(row, q) = size, AUX(row + 1, q) = since;
    return since;
}

static inline void gap_drop(Planner *P, i64 g) {
    i64 q = A(g, GPOS);
    if (q < 0) return;
    i64 last = --P->gaps;
    for (int row = 0; row < AUX_ROWS; row++) AUX(row, q) = AUX(row, last);
    A(AUX(GS, q), GPOS) = q;
    A(g, GPOS) = -1;
    changed(P, q);
    changed(P, last);
}

/* Whether slot q holds a gap of `size` bytes or more other than the one above the last tenant (its
   bytes: *lo, *len). */
static inline int takes(Planner *P, i64 q, i64 size, i64 *lo, i64 *len) {
    if (q >= P->gaps) return 0;
    *lo = AUX(GLO, q), *len = AUX(GHI, q) - *lo;
    return *len >= size && AUX(GS, q) != P->n_t + 1;
}

/* Slot q's best place for `size`: the start or the end of its gap, ranked by sign * since (least
   first), then the smaller gap, then the lower offset. 0 when the slot holds no gap that takes the
   size, or only the one above the last tenant. */
static inline int place_of(Planner *P, i64 q, i64 size, i64 sign, Place *out) {
    i64 lo, len;
    if (!takes(P, q, size, &lo, &len)) return 0;
    i64 key = sign * since_of(P, q, KNOW0, size, lo), off = lo;
    if (len > size) {
        i64 key1 = sign * since_of(P, q, KNOW1, size, lo + len - size);
        if (key1 < key) key = key1, off = lo + len - size;
    }
    out->key = key, out->len = len, out->off = off;
    return 1;
}

static inline int ahead(const Place *x, const Place *y) {
    if (x->key != y->key) return x->key < y->key;
    if (x->len != y->len) return x->len < y->len;
    return x->off < y->off;
}

/* Slot q's leaf: its place, or (exact 0) a bound on it, the least key its bytes allow at its lowest
   offset, which ranks no worse than the place. */
static inline void rank_leaf(Planner *P, Ranking *R, i64 q, int exact) {
    Place *x = &R->leaf[q];
    int holds;
    if (exact) {
        holds = place_of(P, q, R->size, R->sign, x);
    } else {
        i64 lo, len;
        holds = takes(P, q, R->size, &lo, &len);
        if (holds) x->key = R->sign > 0 ? AUX(GLB, q) : -AUX(GUB, q), x->len = len, x->off = lo;
    }
    x->exact = exact;
    R->node[R->cap + q] = holds ? q : R->cap;
}

/* The better of two slots' places (slot cap: none, ranked last). */
static inline i64 better(const Ranking *R, i64 a, i64 b) { return ahead(&R->leaf[b], &R->leaf[a]) ? b : a; }

/* The ranking made anew, over the fewest leaves (a power of two) that hold the gaps. */
static int rank_all(Planner *P, Ranking *R) {
    i64 cap = 1;
    while (cap < P->gaps) cap *= 2;
    if (cap > R->room) {
        if (grow((void **)&R->node, sizeof(i64) * 2 * cap) < 0 || grow((void **)&R->leaf, sizeof(Place) * (cap + 1)) < 0)
            return -1;
        R->room = cap;
    }
    R->cap = cap;
    for (i64 q = 0; q < cap; q++) R->leaf[q].stamp = -1;
    R->leaf[cap] = (Place){INF, INF, INF, -1, 1};
    for (i64 q = 0; q < cap; q++) rank_leaf(P, R, q, 0);
    for (i64 i = cap - 1; i >= 1; i--) R->node[i] = better(R, R->node[2 * i], R->node[2 * i + 1]);
    R->seen = P->clock;
    return 0;
}

/* Leaf q changed: the winners on its path to the root again, up to one that is another slot, unchanged. */
static inline void rank_path(Ranking *R, i64 q) {
    for (i64 i = (R->cap + q) >> 1; i >= 1; i >>= 1) {
        i64 was = R->node[i], now = better(R, R->node[2 * i], R->node[2 * i + 1]);
        R->node[i] = now;
        if (now == was && now != q) break;
    }
}

/* Replays the slots changed since the ranking was last asked, each once, with exact places. */
static void rank_update(Planner *P, Ranking *R) {
    for (; R->seen < P->clock; R->seen++) {
        i64 q = P->changed[R->seen & (CHANGES - 1)];
        if (q >= R->cap || R->leaf[q].stamp == P->clock) continue; /* (past the gaps now, or done) */
        R->leaf[q].stamp = P->clock;
        rank_leaf(P, R, q, 1);
        rank_path(R, q);
    }
}

/* The best place (-1: none): while a bound leads, it is made exact and ranked again. */
static i64 rank_best(Planner *P, Ranking *R) {
    for (;;) {
        i64 q = R->node[1];
        if (q == R->cap) return -1;
        if (R->leaf[q].exact) return q;
        rank_leaf(P, R, q, 1);
        rank_path(R, q);
    }
}

/* The best place for `size` by looking at every gap but those whose bound (row `bound`) is worse than
   the best place found. */
static inline __attribute__((always_inline)) i64 scan(Planner *P, i64 size, i64 sign, int bound, Place *best) {
    i64 found = -1;
    Place x;
    *best = (Place){INF, INF, INF, -1, 1};
    for (i64 q = 0, n = P->gaps; q < n; q++) {
        if (AUX(GHI, q) - AUX(GLO, q) < size || sign * AUX(bound, q) > best->key) continue;
        if (place_of(P, q, size, sign, &x) && ahead(&x, best)) found = q, *best = x;
    }
    return found;
}

/* In *out the ranking for (size, sign), brought up to date, if it was last asked at most gaps / STALE
   changes ago; else it is noted (cap 0) and *out is NULL: the caller looks at every gap. Returns -1
   when out of memory. */
static int ranking(Planner *P, i64 size, i64 sign, Ranking **out) {
    Ranking *R = &P->rk[0];
    *out = NULL;
    for (int r = 0; r < RANKINGS; r++) {
        Ranking *x = &P->rk[r];
        if (x->size == size && x->sign == sign) {
            R = x;
            break;
        }
        if (x->used < R->used) R = x;
    }
    R->used = ++P->asks;
    i64 behind = P->clock - R->seen;
    int fresh = R->size == size && R->sign == sign && behind <= P->gaps / STALE && behind <= CHANGES;
    if (!fresh) {
        R->size = size, R->sign = sign, R->cap = 0, R->seen = P->clock;
        return 0;
    }
    *out = R;
    if (R->cap == 0 || P->gaps > R->cap) return rank_all(P, R);
    rank_update(P, R);
    return 0;
}

/* Arena.fit: the node after the gap chosen (-1: none holds size; -2: out of memory), its offset and since
   when its bytes are free. The gap above the last tenant is used, at its start, only when no other gap
   holds the size. */
static i64 fit(Planner *P, i64 size, int newest, i64 *offset, i64 *since) {
    i64 sign = newest ? -1 : 1, top = P->n_t + 1, top_q = A(top, GPOS), best;
    Place place;
    Ranking *R = NULL;
    if (P->gaps >= P->rank_gaps && ranking(P, size, sign, &R) < 0) return -2;
    if (R) {
        best = rank_best(P, R);
        if (best >= 0) place = R->leaf[best];
    } else {
        best = newest ? scan(P, size, -1, GUB, &place) : scan(P, size, 1, GLB, &place);
    }
    if (best >= 0) {
        *offset = place.off;
        *since = sign * place.key;
        return AUX(GS, best);
    }
    if (top_q >= 0 && AUX(GHI, top_q) - AUX(GLO, top_q) >= size) {
        i64 lo = AUX(GLO, top_q);
        *offset = lo;
        *since = (i64)seg_max(&P->f, lo, lo + size);
        return top;
    }
    return -1;
}

/* -- tenants that may move, ranked as victims: a key is the tenant's next use (belady; no next use:
   the number of ops) or the number of ops less its last access (lru), so a larger key is a better
   victim. Row 0 of kh heads a list of the tenants of each key (RK_NEXT, RK_PREV); rows 1 to 3 are
   bitmaps, 32 bits a word: bit b of word w of row r is set when index 32 w + b of row r - 1 holds
   anything, so the best key at or below any other is found in a few steps. */

static inline void rank_add(Planner *P, i64 t, i64 key) {
    i64 h = KH(0, key);
    TR(t, rk_next) = h, TR(t, rk_prev) = -1, TR(t, rk_key) = key;
    KH(0, key) = t;
    if (h >= 0) {
        TR(h, rk_prev) = t;
        return;
    }
    for (i64 r = 1, y = key; r < 4; r++) {
        i64 w = y >> 5, was = KH(r, w);
        KH(r, w) = was | ((i64)1 << (y & 31));
        if (was != 0) return;
        y = w;
    }
}

static inline void rank_drop(Planner *P, i64 t) {
    i64 key = TR(t, rk_key);
    if (key < 0) return;
    i64 after = TR(t, rk_next), before = TR(t, rk_prev);
    if (before >= 0) TR(before, rk_next) = after;
    else KH(0, key) = after;
    if (after >= 0) TR(after, rk_prev) = before;
    TR(t, rk_key) = -1;
    if (KH(0, key) >= 0) return;
    for (i64 r = 1, y = key; r < 4; r++) {
        i64 w = y >> 5;
        KH(r, w) &= ~((i64)1 << (y & 31));
        if (KH(r, w) != 0) return;
        y = w;
    }
}

static inline i64 high_bit(i64 x) { return 63 - __builtin_clzll((unsigned long long)x); }

/* The largest key at most x that some tenant has, else -1. */
static i64 best_key(Planner *P, i64 x) {
    if (x < 0) return -1;
    i64 r = 1, y = x;
    for (;;) {
        i64 w = y >> 5, bits = KH(r, w) & (((i64)2 << (y & 31)) - 1);
        if (bits != 0) {
            y = 32 * w + high_bit(bits);
            break;
        }
        if (r == 3) {
            while (bits == 0) {
                if (--w < 0) return -1;
                bits = KH(3, w);
            }
            y = 32 * w + high_bit(bits);
            break;
        }
        y = w - 1, r++;
        if (y < 0) return -1;
    }
    while (r > 1) {
        r--;
        y = 32 * y + high_bit(KH(r, y));
    }
    return y;
}

/* Room for keys 0 to n_keys - 1: row 0 of kh empty (-1), each bitmap row a 32nd of the row below. */
static int kh_alloc(Planner *P, i64 n_keys) {
    i64 len = n_keys, at = 0;
    P->kh_w = n_keys;
    for (int r = 0; r < 4; r++) {
        P->kh_row[r] = at;
        at += len;
        len = len / 32 + 1;
    }
    P->kh = calloc(at, sizeof(i64));
    if (!P->kh) return -1;
    for (i64 w = 0; w < n_keys; w++) KH(0, w) = -1;
    return 0;
}

static inline i64 rank_of(Planner *P, i64 t, int belady) {
    if (belady) return TR(t, next_use) != INF ? TR(t, next_use) : P->n_ops;
    return P->n_ops - 1 - TR(t, last);
}

/* arena tenants */

static inline i64 insert(Planner *P, i64 g, i64 offset, i64 size, i64 t, i64 key) {
    i64 m = P->spare[--P->free_nodes], before = A(g, PV), q = A(g, GPOS);
    i64 lo = AUX(GLO, q), hi = AUX(GHI, q);
    A(m, NX) = g, A(m, PV) = before, A(before, NX) = m, A(g, PV) = m;
    A(m, OFF) = offset, A(m, END) = offset + size, A(m, TEN) = t, A(m, GPOS) = -1, A(m, RUN_AT) = -1, TR(t, node) = m;
    P->nb[2 * m] = AUX(GLB, q), P->nb[2 * m + 1] = AUX(GUB, q);
    if (offset > lo) know(P, q, gap_put(P, m, lo, offset, AUX(GLB, q), AUX(GUB, q)), KNOW0, offset - lo);
    if (offset + size == hi) {
        gap_drop(P, g);
    } else {
        AUX(GLO, q) = offset + size, AUX(KNOW0, q) = -1, AUX(KNOW0 + KNOW_OLD, q) = -1;
        know(P, q, q, KNOW1, hi - offset - size);
        changed(P, q);
    }
    P->tenants++;
    P->bytes += size;
    if (key >= 0) rank_add(P, t, key);
    return offset;
}

static int remove_tenant(Planner *P, i64 t, i64 pos) {
    i64 m = TR(t, node), before = A(m, PV), after = A(m, NX);
    if (pos >= 0) {
        if (segs_reserve(&P->f) < 0) return -1;
        seg_assign(&P->f, A(m, OFF), A(m, END), (double)pos);
    }
    i64 qm = A(m, GPOS), qa = A(after, GPOS);
    i64 lb = pos >= 0 ? pos : P->nb[2 * m], ub = pos >= 0 ? pos : P->nb[2 * m + 1];
    if (qa >= 0) lb = min64(lb, AUX(GLB, qa)), ub = max64(ub, AUX(GUB, qa));
    if (qm >= 0) lb = min64(lb, AUX(GLB, qm)), ub = max64(ub, AUX(GUB, qm));
    qa = gap_put(P, after, A(before, END), A(after, OFF), lb, ub);
    AUX(KNOW0, qa) = -1, AUX(KNOW0 + KNOW_OLD, qa) = -1;
    if (qm >= 0) {
        know(P, qm, qa, KNOW0, INF);
        gap_drop(P, m);
    }
    A(before, NX) = after, A(after, PV) = before;
    P->spare[P->free_nodes++] = m;
    P->tenants--;
    P->bytes -= A(m, END) - A(m, OFF);
    rank_drop(P, t);
    return 0;
}

/* the heap of tensors waiting on the host, by (next use, tensor); stale entries stay until on top */

static inline int hp_less(Planner *P, i64 i, i64 j) {
    return P->hk[i] < P->hk[j] || (P->hk[i] == P->hk[j] && P->ht[i] < P->ht[j]);
}

static int hp_push(Planner *P, i64 key, i64 t) {
    if (P->hp_n == P->hp_room) {
        i64 room = 2 * P->hp_room + 16;
        if (grow((void **)&P->hk, sizeof(i64) * room) < 0 || grow((void **)&P->ht, sizeof(i64) * room) < 0)
            return -1;
        P->hp_room = room;
    }
    i64 i = P->hp_n++;
    P->hk[i] = key, P->ht[i] = t;
    while (i > 0 && hp_less(P, i, (i - 1) / 2)) {
        i64 up = (i - 1) / 2, k = P->hk[i], v = P->ht[i];
        P->hk[i] = P->hk[up], P->ht[i] = P->ht[up], P->hk[up] = k, P->ht[up] = v;
        i = up;
    }
    return 0;
}

static void hp_pop(Planner *P) {
    i64 n = --P->hp_n, j = 0;
    P->hk[0] = P->hk[n], P->ht[0] = P->ht[n];
    for (;;) {
        i64 s = j, left = 2 * j + 1, right = 2 * j + 2;
        if (left < n && hp_less(P, left, s)) s = left;
        if (right < n && hp_less(P, right, s)) s = right;
        if (s == j) return;
        i64 k = P->hk[j], v = P->ht[j];
        P->hk[j] = P->hk[s], P->ht[j] = P->ht[s], P->hk[s] = k, P->ht[s] = v;
        j = s;
    }
}

/* The best window to clear (reference._Planner.window): its first tenant's node (-1: none) and, in *kj,
   the node after its last. A window is as good as its worst tenant, so tenants are admitted best key
   first: admitted neighbours form runs (RUN_END of a run's first node is its last and the other way
   round), and the first key at which a run, with the gaps around it, spans the size is the best score.
   Every window of that score lies in such a run and holds a tenant of that key, so only the windows
   around those tenants are compared, by bytes, then offset. A tenant that may not move (fixed, or the
   op's own unless bouncing one that was on the device before the op) is never admitted. */
static i64 window(Planner *P, i64 size, i64 stamp, int bounce, i64 *kj) {
    i64 scan = ++P->scans, *found = P->found, nkey = 0;
    int spanned = 0;
    for (i64 x = best_key(P, P->kh_w - 1); x >= 0 && !spanned; x = best_key(P, x - 1)) {
        nkey = 0;
        for (i64 t = KH(0, x); t >= 0; t = TR(t, rk_next)) {
            if (TR(t, fixed) || (TR(t, mark) == stamp && !(bounce && TR(t, resident) == stamp))) continue;
            i64 m = TR(t, node);
            i64 first = A(A(m, PV), RUN_AT) == scan ? A(A(m, PV), RUN_END) : m;
            i64 last = A(A(m, NX), RUN_AT) == scan ? A(A(m, NX), RUN_END) : m;
            A(m, RUN_AT) = scan;
            A(first, RUN_END) = last, A(last, RUN_END) = first;
            found[nkey++] = m;
            spanned = spanned || A(A(last, NX), OFF) - A(A(first, PV), END) >= size;
        }
    }
    i64 best_k = -1, best_j = -1, b_total = 0, b_lo = 0;
    for (i64 q = 0; q < (spanned ? nkey : 0); q++) {
        i64 f = found[q], k = f;
        while (A(A(k, PV), RUN_AT) == scan && A(A(A(k, PV), PV), END) + size > A(f, OFF)) k = A(k, PV);
        i64 j = k, total = 0;
        for (;;) {
            i64 lo = A(A(k, PV), END);
            while (A(j, RUN_AT) == scan && A(j, OFF) < lo + size) {
                total += A(j, END) - A(j, OFF);
                j = A(j, NX);
            }
            if (A(j, OFF) < lo + size) break;
            if (j == k) {
                if (k == f) break;
                k = j = A(k, NX);
                continue;
            }
            if (best_k < 0 || total < b_total || (total == b_total && lo < b_lo))
                best_k = k, best_j = j, b_total = total, b_lo = lo;
            if (k == f) break;
            total -= A(k, END) - A(k, OFF);
            k = A(k, NX);
        }
    }
    *kj = best_j;
    return best_k;
}

/* Tenant v leaves after its last use so far: copied out first if still needed; an early swap-in not used
   yet is taken back instead, as if never made (its record's bucket set to -1). */
static int evict(Planner *P, i64 v, i64 loss) {
    i64 nxt = TR(v, next_use);
    if (TR(v, early_rec) >= 0) {
        P->recs[5 * TR(v, early_rec)] = -1;
        TR(v, early_rec) = -1;
        if (remove_tenant(P, v, -1) < 0) return -1;
        TR(v, where) = -1;
        P->early_limit = min64(P->early_limit, nxt);
        return hp_push(P, nxt, v);
    }
    i64 kp = TR(v, last);
    if ((nxt != INF || v == loss) && !TR(v, host)) {
        record(P, kp + 1, SWAP_OUT, v, -1, -1);
        TR(v, host) = 1, TR(v, host_at) = kp;
    }
    record(P, kp + 1, FREE, v, -1, -1);
    if (remove_tenant(P, v, kp) < 0) return -1;
    TR(v, where) = -1, TR(v, released) = kp;
    return nxt != INF ? hp_push(P, nxt, v) : 0;
}

/* placement order: largest first, then by id */
static inline void sort_todo(Planner *P, i64 *todo, i64 n) {
    for (i64 i = 1; i < n; i++) {
        i64 t = todo[i], j = i - 1;
        while (j >= 0 && (TR(todo[j], size) < TR(t, size) || (TR(todo[j], size) == TR(t, size) && todo[j] > t))) {
            todo[j + 1] = todo[j];
            j--;
        }
        todo[j + 1] = t;
    }
}

static inline void sort_ints(i64 *a, i64 n) {
    for (i64 i = 1; i < n; i++) {
        i64 x = a[i], j = i - 1;
        while (j >= 0 && a[j] > x) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = x;
    }
}

typedef struct {
    const i64 *schedule, *policy, *size, *in_ptr, *in_idx, *out_ptr, *out_idx, *upd_old, *upd_new, *by_name;
    const i64 *after_ptr, *after_idx;  /* per tensor host ops make within the step: the ops it follows (CSR) */
    const uint8_t *pinned0, *in_place, *is_input, *persistent, *fwd_act;
    i64 n_ops, n_t, n_upd, n_by_name, cap, loss, width, rank_gaps, n_after;
    i64 *out_off;
} Inputs;

/* The op's inputs not on the device (once each: QUEUED marks them with tag) and its outputs other than
   an in-place one, largest first. */
static i64 queue(Planner *P, const Inputs *in, i64 *todo, i64 op, i64 ipo, i64 tag) {
    i64 n = 0;
    for (i64 j = in->in_ptr[op]; j < in->in_ptr[op + 1]; j++) {
        i64 t = in->in_idx[j];
        if (TR(t, where) < 0 && TR(t, queued) != tag) {
            TR(t, queued) = tag;
            todo[n++] = t;
        }
    }
    for (i64 j = in->out_ptr[op]; j < in->out_ptr[op + 1]; j++)
        if (in->out_idx[j] != ipo) todo[n++] = in->out_idx[j];
    sort_todo(P, todo, n);
    return n;
}

/* status of plan(): DONE, NO_ROOM_FIXED (for what never moves), NO_ROOM_TENSOR, OUT_OF_RECORDS (the
   caller grows the records and calls again), OUT_OF_MEMORY */

/* Place the op's missing inputs and its outputs; returns a status (0: placed). pend/pend_since get the
   swap-ins (tensor, since when its bytes are free). */
static int place_op(Planner *P, const Inputs *in, i64 pos, i64 ipo, int belady, i64 newest_from, i64 *todo,
                    i64 *pend, i64 *pend_since, i64 *npend_out, i64 *peak) {
    i64 op = in->schedule[pos], stamp = pos + 1, o0 = in->out_ptr[op], o1 = in->out_ptr[op + 1];
    i64 ntodo = queue(P, in, todo, op, ipo, stamp), npend = 0;
    int packed = 0;
    while (ntodo > 0) {
        i64 t = todo[0], offset, since;
        memmove(todo, todo + 1, sizeof(i64) * --ntodo);
        int newest = TR(t, is_out) == stamp && pos >= newest_from;
        i64 g = fit(P, TR(t, size), newest, &offset, &since);
        if (g == -2) return -1;
        for (int bounce = 0; g < 0 && bounce < 2; bounce++) {
            i64 kj, k = window(P, TR(t, size), stamp, bounce, &kj);
            if (k < 0) continue;
            while (k != kj) {
                i64 v = A(k, TEN);
                k = A(k, NX);
                if (TR(v, resident) == stamp && bounce) {
                    TR(v, resident) = 0;
                    todo[ntodo++] = v;
                }
                if (evict(P, v, in->loss) < 0) return -1;
            }
            sort_todo(P, todo, ntodo);
            g = fit(P, TR(t, size), newest, &offset, &since);
            if (g == -2) return -1;
            break;
        }
        if (g < 0 && !packed) { /* last resort: take back this op's placements, clear everything */
            for (i64 j = 0; j < npend; j++) {
                if (remove_tenant(P, pend[j], -1) < 0) return -1;
                TR(pend[j], where) = -1;
            }
            for (i64 j = o0; j < o1; j++) {
                i64 u = in->out_idx[j];
                if (u != ipo && TR(u, where) >= 0) {
                    if (remove_tenant(P, u, -1) < 0) return -1;
                    TR(u, where) = -1;
                }
            }
            for (i64 k = A(P->n_t, NX), top = P->n_t + 1; k != top;) {
                i64 v = A(k, TEN);
                k = A(k, NX);
                if (!TR(v, fixed)) {
                    TR(v, resident) = 0;
                    if (evict(P, v, in->loss) < 0) return -1;
                }
            }
            npend = 0, packed = 1;
            ntodo = queue(P, in, todo, op, ipo, -stamp);
            continue;
        }
        if (g < 0) return NO_ROOM_TENSOR;
        TR(t, where) = insert(P, g, offset, TR(t, size), t, rank_of(P, t, belady));
        *peak = max64(*peak, TR(t, where) + TR(t, size));
        if (TR(t, is_out) == stamp) {
            in->out_off[t] = TR(t, where);
        } else {
            pend[npend] = t, pend_since[npend] = since;
            npend++;
        }
    }
    *npend_out = npend;
    return 0;
}

/* After the run: uses advance, keys change, write-backs and vDNN offloads, then frees. */
static int after_op(Planner *P, const Inputs *in, i64 pos, int belady, int offload, i64 turn, i64 *todo) {
    i64 op = in->schedule[pos];
    i64 i0 = in->in_ptr[op], i1 = in->in_ptr[op + 1], o0 = in->out_ptr[op], o1 = in->out_ptr[op + 1];
    for (i64 j = i0; j < i1; j++) {
        i64 t = in->in_idx[j];
        TR(t, last) = pos, TR(t, early_rec) = -1;
    }
    for (i64 j = o0; j < o1; j++) TR(in->out_idx[j], last) = pos;
    for (i64 j = i0; j < i1; j++) {
        i64 t = in->in_idx[j];
        if (TR(t, next_use) == pos) {
            i64 i = TR(t, next_i) + 1;
            TR(t, next_i) = i, TR(t, next_use) = i < TR(t, use_end) ? P->use_pos[i] : INF;
        }
    }
    for (i64 j = i0; j < o1 + i1 - o0; j++) { /* the op's tensors still ranked take their new keys */
        i64 t = j < i1 ? in->in_idx[j] : in->out_idx[j - i1 + o0];
        if (TR(t, rk_key) >= 0) {
            i64 key = rank_of(P, t, belady);
            if (key != TR(t, rk_key)) {
                rank_drop(P, t);
                rank_add(P, t, key);
            }
        }
    }
    for (i64 j = o0; j < o1; j++) {
        i64 t = in->out_idx[j], nxt = TR(t, next_use);
        int off_t = offload && pos < turn && in->fwd_act[t] && nxt != INF && TR(t, last_use) >= turn;
        if ((TR(t, write_back) || off_t) && !TR(t, host)) {
            record(P, pos + 1, SWAP_OUT, t, -1, -1);
            TR(t, host) = 1, TR(t, host_at) = pos;
        }
    }
    i64 nt = 0;
    for (i64 j = i0; j < i1; j++) todo[nt++] = in->in_idx[j];
    for (i64 j = o0; j < o1; j++) todo[nt++] = in->out_idx[j];
    sort_ints(todo, nt);
    for (i64 j = 0; j < nt; j++) {
        i64 t = todo[j];
        if ((j > 0 && todo[j - 1] == t) || TR(t, where) < 0 || TR(t, pinned) || t == in->loss) continue;
        i64 nxt = TR(t, next_use);
        if (nxt == INF || (offload && TR(t, host) && !TR(t, fixed) && pos < turn && turn <= nxt)) {
            record(P, pos + 1, FREE, t, -1, -1);
            if (remove_tenant(P, t, pos) < 0) return -1;
            TR(t, where) = -1, TR(t, released) = pos;
            if (nxt != INF && hp_push(P, nxt, t) < 0) return -1;
        }
    }
    return 0;
}

/* Early swap-ins (reference._Planner.bring_early); returns a status. */
static int bring_early(Planner *P, const Inputs *in, i64 pos, int belady, i64 reserve, i64 horizon, i64 *peak) {
    while (reserve >= 0 && P->hp_n > 0) {
        i64 nxt = P->hk[0], t = P->ht[0], offset, since;
        if (TR(t, where) >= 0 || TR(t, next_use) != nxt) {
            hp_pop(P);
            continue;
        }
        if (nxt >= P->early_limit || nxt - pos > horizon) break;
        if (TR(t, host_at) > pos) break; /* (made on the host once what it follows has gone down) */
        if (in->cap - P->bytes - TR(t, size) < reserve) break;
        i64 g = fit(P, TR(t, size), 0, &offset, &since);
        if (g == -2) return -1;
        if (g < 0) break;
        hp_pop(P);
        if (P->nrec == P->rec_room) return OUT_OF_RECORDS;
        TR(t, where) = insert(P, g, offset, TR(t, size), t, rank_of(P, t, belady));
        *peak = max64(*peak, TR(t, where) + TR(t, size));
        TR(t, early_rec) = P->nrec;
        i64 at = max64(max64(since, TR(t, released)), TR(t, host_at));
        record(P, at + 1, SWAP_IN, t, TR(t, where), in->schedule[nxt]);
    }
    return 0;
}

/* Pinned tensors by name, then inputs by name, from the bottom; then what starts on the host waits
   (by_name: the persistent tensors and the inputs, which are all that may start anywhere but nowhere). */
static int place_fixed(Planner *P, const Inputs *in, i64 *peak) {
    for (i64 i = 0; i < in->n_by_name; i++) {
        i64 t = in->by_name[i];
        if (TR(t, host) && !in->is_input[t] && TR(t, next_use) != INF && hp_push(P, TR(t, next_use), t) < 0)
            return -1;
    }
    for (int sweep = 0; sweep < 2; sweep++) {
        for (i64 i = 0; i < in->n_by_name; i++) {
            i64 t = in->by_name[i], offset, since;
            if (!((sweep == 0 && in->pinned0[t]) || (sweep == 1 && in->is_input[t]))) continue;
            i64 g = fit(P, TR(t, size), 0, &offset, &since);
            if (g < 0) return g == -2 ? OUT_OF_MEMORY : NO_ROOM_FIXED;
            TR(t, where) = in->out_off[t] = insert(P, g, offset, TR(t, size), t, -1);
            *peak = max64(*peak, TR(t, where) + TR(t, size));
        }
    }
    return 0;
}

static int plan_loop(Planner *P, const Inputs *in, i64 turn, i64 *peak) {
    const i64 *policy = in->policy;
    int belady = policy[P_VICTIM] == VICTIM_BELADY, offload = policy[P_OFFLOAD] == 1;
    i64 prefetch = policy[P_PREFETCH], reserve = policy[P_RESERVE], horizon = policy[P_HORIZON];
    i64 outputs = policy[P_OUTPUTS];
    i64 newest_from = outputs == OUTPUTS_OLDEST ? in->n_ops : (outputs == OUTPUTS_NEWEST ? 0 : turn);
    i64 *todo = malloc(sizeof(i64) * 3 * in->width), *pend = todo + in->width, *pend_since = pend + in->width;
    if (!todo) return -1;
    int status = place_fixed(P, in, peak);
    for (i64 pos = 0; pos < in->n_ops && status == DONE; pos++) {
        i64 op = in->schedule[pos], stamp = pos + 1, npend = 0;
        i64 i0 = in->in_ptr[op], i1 = in->in_ptr[op + 1], o0 = in->out_ptr[op], o1 = in->out_ptr[op + 1];
        i64 width = 2 * ((i1 - i0) + (o1 - o0)) + 4, most = 2 * P->tenants + 3 * width;
        if (P->nrec + 2 * most + width > P->rec_room) {
            status = OUT_OF_RECORDS;
            break;
        }
        i64 ipo = in->in_place[op] ? in->out_idx[o0] : -1;
        for (i64 j = i0; j < i1; j++) {
            i64 t = in->in_idx[j];
            TR(t, mark) = stamp;
            if (TR(t, where) >= 0) TR(t, resident) = stamp;
        }
        for (i64 j = o0; j < o1; j++) {
            i64 t = in->out_idx[j];
            TR(t, mark) = stamp;
            if (t != ipo) TR(t, is_out) = stamp;
        }
        status = place_op(P, in, pos, ipo, belady, newest_from, todo, pend, pend_since, &npend, peak);
        if (status != DONE) break;
        for (i64 j = 0; j < npend; j++) {
            i64 t = pend[j], floor = max64(max64(pend_since[j], TR(t, released)), TR(t, host_at));
            i64 at = prefetch == PREFETCH_NONE ? pos - 1 : (prefetch == PREFETCH_EARLIEST ? floor : pos - 2);
            record(P, max64(at, floor) + 1, SWAP_IN, t, TR(t, where), op);
        }
        if (ipo >= 0) {
            i64 old = in->in_idx[i0];
            TR(ipo, where) = in->out_off[ipo] = TR(old, where);
            TR(old, where) = -1;
            TR(ipo, node) = TR(old, node);
            A(TR(ipo, node), TEN) = ipo;
            rank_drop(P, old);
            if (TR(old, pinned)) TR(ipo, pinned) = TR(ipo, fixed) = 1;
            else rank_add(P, ipo, rank_of(P, ipo, belady));
        }
        record(P, pos + 1, LAUNCH, op, -1, -1);
        status = after_op(P, in, pos, belady, offload, turn, todo);
        if (status != DONE) break;
        if (pos >= P->early_limit) P->early_limit = INF;
        status = bring_early(P, in, pos, belady, reserve, horizon, peak);
    }
    free(todo);
    return status;
}

/* Each tensor's row as the planner starts, and the positions that read each tensor (CSR: use_ptr, kept
   after the found rows in P->found). */
static void tensor_rows(Planner *P, const Inputs *in, const i64 *use_ptr, const i64 *use_pos, const i64 *pos_of,
                        i64 n_all) {
    for (i64 t = 0; t < in->n_t; t++) {
        int has_use = use_ptr[t + 1] > use_ptr[t];
        in->out_off[t] = -1;
        P->tr[t] = (Tensor){
            .where = -1, .size = in->size[t], .next_use = has_use ? use_pos[use_ptr[t]] : INF,
            .last = -1, .next_i = use_ptr[t], .use_end = use_ptr[t + 1],
            .last_use = has_use ? use_pos[use_ptr[t + 1] - 1] : -1, .node = -1, .rk_next = -1, .rk_prev = -1,
            .rk_key = -1, .early_rec = -1, .host_at = -1, .released = -1,
            .fixed = in->pinned0[t] || in->is_input[t], .pinned = in->pinned0[t],
            .host = in->is_input[t] || (in->persistent[t] && !in->pinned0[t]),
        };
    }
    for (i64 j = 0; j < in->n_upd; j++)  /* (old -1: what host ops read, copied out once made) */
        if (in->upd_old[j] < 0 || (in->persistent[in->upd_old[j]] && !in->pinned0[in->upd_old[j]]))
            P->tr[in->upd_new[j]].write_back = 1;
    for (i64 t = 0; t < in->n_t && t < in->n_after; t++)  /* its host copy exists once these ops' outputs left */
        for (i64 j = in->after_ptr[t]; j < in->after_ptr[t + 1]; j++)
            if (in->after_idx[j] < n_all) P->tr[t].host_at = (int32_t)max64(P->tr[t].host_at, pos_of[in->after_idx[j]]);
}

/* The whole pass: returns a status (above); on 0, nrec records were written to recs. */
static int plan(const Inputs *in, i64 *recs, i64 rec_room, i64 *room, i64 *nrec, i64 *peak) {
    i64 n_t = in->n_t, n_ops = in->n_ops, n_uses = 0;
    for (i64 pos = 0; pos < n_ops; pos++) n_uses += in->in_ptr[in->schedule[pos] + 1] - in->in_ptr[in->schedule[pos]];
    Planner S = {0}, *P = &S;
    P->n_t = n_t, P->n_ops = n_ops, P->rank_gaps = in->rank_gaps;
    P->recs = recs, P->rec_room = rec_room, P->early_limit = INF, P->free_nodes = n_t;
    i64 n_all = 1;  /* ops: past the highest the schedule runs */
    for (i64 pos = 0; pos < n_ops; pos++) n_all = max64(n_all, in->schedule[pos] + 1);
    i64 *use_ptr = calloc(n_t + 1, sizeof(i64)), *pos_of = malloc(sizeof(i64) * n_all);
    P->a = aligned_alloc(64, sizeof(i64) * (n_t + 2) * A_COLS);
    P->nb = malloc(sizeof(i64) * 2 * (n_t + 2));
    P->aux = malloc(sizeof(i64) * AUX_ROWS * (n_t + 2));
    P->spare = malloc(sizeof(i64) * (n_t + 1));
    P->tr = malloc(sizeof(Tensor) * n_t);
    P->found = malloc(sizeof(i64) * (n_t + n_uses + 1)); /* window's found rows, then use positions */
    P->hp_room = room[1] > 1 ? room[1] : 1;
    P->hk = malloc(sizeof(i64) * P->hp_room);
    P->ht = malloc(sizeof(i64) * P->hp_room);
    i64 total = 0;
    for (i64 t = 0; t < n_t; t++) total += in->size[t];
    int status = -1;
    if (!use_ptr || !pos_of || !P->a || !P->nb || !P->aux || !P->spare || !P->tr || kh_alloc(P, n_ops + 1) < 0 || !P->found || !P->hk || !P->ht ||
        segs_init(&P->f, min64(in->cap, total), 2 * room[2] + 2, -1.0) < 0)
        goto done;
    i64 *use_pos = P->use_pos = P->found + n_t;
    for (i64 pos = 0; pos < n_ops; pos++) {
        i64 op = in->schedule[pos];
        for (i64 j = in->in_ptr[op]; j < in->in_ptr[op + 1]; j++) use_ptr[in->in_idx[j] + 1]++;
    }
    for (i64 t = 0; t < n_t; t++) use_ptr[t + 1] += use_ptr[t];
    i64 *fill = (i64 *)P->tr; /* (scratch: tr is filled below) */
    memcpy(fill, use_ptr, sizeof(i64) * n_t);
    for (i64 pos = 0; pos < n_ops; pos++) {
        i64 op = in->schedule[pos];
        for (i64 j = in->in_ptr[op]; j < in->in_ptr[op + 1]; j++) use_pos[fill[in->in_idx[j]]++] = pos;
    }
    for (i64 op = 0; op < n_all; op++) pos_of[op] = -1;
    for (i64 pos = 0; pos < n_ops; pos++) pos_of[in->schedule[pos]] = pos;
    tensor_rows(P, in, use_ptr, use_pos, pos_of, n_all);
    for (i64 m = n_t * A_COLS; m < (n_t + 2) * A_COLS; m++) P->a[m] = -1; /* other nodes are set up as they are taken */
    for (i64 m = 0; m < n_t; m++) P->spare[m] = n_t - 1 - m;
    i64 head = n_t, top = n_t + 1;
    A(head, END) = 0, A(head, NX) = top, A(top, PV) = head, A(top, OFF) = in->cap;
    if (in->cap > 0) gap_put(P, top, 0, in->cap, -1, -1);
    i64 turn = n_ops;
    for (i64 pos = 0; pos < n_ops; pos++) {
        i64 op = in->schedule[pos];  /* (an op with no outputs runs on the host: planning/problem.py) */
        if (in->out_ptr[op + 1] > in->out_ptr[op] && !in->fwd_act[in->out_idx[in->out_ptr[op]]]) {
            turn = pos;
            break;
        }
    }
    *peak = 0;
    status = plan_loop(P, in, turn, peak);
    *nrec = P->nrec;
    room[1] = max64(room[1], P->hp_room), room[2] = max64(room[2], P->f.room / 2);
done:
    free(use_ptr), free(pos_of), free(P->a), free(P->nb), free(P->aux), free(P->spare), free(P->tr), free(P->kh), free(P->found), free(P->hk), free(P->ht);
    segs_free(&P->f);
    for (int r = 0; r < RANKINGS; r++) free(P->rk[r].node), free(P->rk[r].leaf);
    return status;
}

/* -- the simulator: the compute stream, the two copy streams, the network lane (data-parallel
   all-reduces) and the host lane, FIFO each, one pass over the records in program order (by bucket, then
   kind; stable), as simulate.simulate replays a plan. The host lane's ops come each after the record it
   follows (hostlane.py), and every collective, on either lane, holds the one network link: it starts once
   the collectives before it in program order are done. */

/* The records' indices in program order, *n_out of them (the frees among them: *n_free). */
static i64 *program_order(const i64 *recs, i64 n_rec, i64 n_ops, i64 *n_out, i64 *n_free) {
    i64 n_keys = 4 * (n_ops + 1);
    i64 *start = calloc(n_keys + 1, sizeof(i64));
    if (!start) return NULL;
    *n_free = 0;
    for (i64 r = 0; r < n_rec; r++) {
        if (recs[5 * r] < 0) continue;
        start[recs[5 * r] * 4 + recs[5 * r + 1] + 1]++;
        *n_free += recs[5 * r + 1] == FREE;
    }
    for (i64 k = 0; k < n_keys; k++) start[k + 1] += start[k];
    *n_out = start[n_keys];
    i64 *order = malloc(sizeof(i64) * (*n_out + 1));
    if (order)
        for (i64 r = 0; r < n_rec; r++)
            if (recs[5 * r] >= 0) order[start[recs[5 * r] * 4 + recs[5 * r + 1]]++] = r;
    free(start);
    return order;
}

typedef struct {
    const i64 *schedule, *recs, *out_off, *size, *in_ptr, *in_idx, *out_ptr, *out_idx, *nbytes;
    const double *op_ms, *copy, *host_start;  /* host_start: when each tensor's host copy exists (ms) */
    const uint8_t *net;  /* per op: the network lane runs it (a data-parallel all-reduce), not compute */
    double *copy_done;  /* out: when each tensor's swap-out, or if none its last swap-in, is done (ms; 0: none) */
    /* the host lane's ops after its start ops, in lane order: the record position each follows (-1: none),
       the tensors whose copies it waits for (CSR), its time, and whether it is a collective */
    const i64 *host_at, *host_cp_ptr, *host_cp_idx, *host_out_ptr, *host_out_idx;  /* out: what it makes for
                                                                                  the device (CSR) */
    const double *host_ms;
    const uint8_t *host_coll;
    double *host_clock;  /* in: when the start ops are done; out: when the lane's last op is */
    i64 n_ops, n_rec, n_t, top, n_host;
} SimInputs;

/* Run the host lane's ops that follow record position ``at``, from *next on; what one makes for the device
   is on the host (host_ready) once it ends. */
static void host_ops(const SimInputs *in, i64 at, i64 *next, double *clock, double *link, double *host_ready) {
    for (; *next < in->n_host && in->host_at[*next] <= at; (*next)++) {
        i64 h = *next;
        double start = *clock;
        for (i64 j = in->host_cp_ptr[h]; j < in->host_cp_ptr[h + 1]; j++)
            start = dmax(start, in->copy_done[in->host_cp_idx[j]]);
        if (in->host_coll[h]) start = dmax(start, *link);
        *clock = start + in->host_ms[h];
        if (in->host_coll[h]) *link = *clock;
        for (i64 j = in->host_out_ptr[h]; j < in->host_out_ptr[h + 1]; j++) host_ready[in->host_out_idx[j]] = *clock;
    }
}

static int simulate(const SimInputs *in, double *ms, i64 *h2d_out, i64 *d2h_out) {
    i64 n_ord = 0, n_t = in->n_t, n_free = 0;
    i64 *order = program_order(in->recs, in->n_rec, in->n_ops, &n_ord, &n_free), *where = malloc(sizeof(i64) * n_t);
    double *times = calloc(4 * n_t + in->n_ops, sizeof(double));
    char *out_ever = calloc(n_t + 1, 1);
    Segs g = {0};
    int status = -1;
    if (!order || !where || !times || !out_ever || segs_init(&g, in->top, 2 * n_free + 2, 0.0) < 0) goto done;
    double *ready = times, *host_ready = times + n_t, *copied_out = times + 2 * n_t, *net_read = times + 3 * n_t,
           *op_end = times + 4 * n_t;  /* net_read: when the network lane's last read of a tensor ends */
    memcpy(where, in->out_off, sizeof(i64) * n_t);
    memcpy(host_ready, in->host_start, sizeof(double) * n_t);
    memset(in->copy_done, 0, sizeof(double) * n_t);
    double latency = in->copy[0], h2d_bw = in->copy[1], d2h_bw = in->copy[2];
    double compute = 0.0, net = 0.0, h2d_clock = 0.0, d2h_clock = 0.0, host = *in->host_clock, link = 0.0;
    double last_end = 0.0;  /* "after" the latest run: what "after" a hollow op (a host op's) means */
    i64 h2d = 0, d2h = 0, next_host = 0;
    host_ops(in, -1, &next_host, &host, &link, host_ready);
    for (i64 i = 0; i < n_ord; i++) {
        const i64 *rec = in->recs + 5 * order[i];
        i64 bucket = rec[0], kind = rec[1], t = rec[2], offset = rec[3];
        double after = bucket > 0 ? op_end[bucket - 1] : 0.0;
        if (kind == LAUNCH && in->out_ptr[t + 1] == in->out_ptr[t]) {  /* a hollow op: it runs on the host */
            op_end[bucket - 1] = last_end;  /* (hostlane.with_host_runs: what follows it follows the run before) */
        } else if (kind == LAUNCH) {
            i64 op = t;
            double start = in->net[op] ? dmax(net, link) : compute;
            for (i64 j = in->in_ptr[op]; j < in->in_ptr[op + 1]; j++) start = dmax(start, ready[in->in_idx[j]]);
            /* (no op works in place over what an all-reduce reads: a raw gradient's one reader is its all-reduce) */
            for (i64 j = in->out_ptr[op]; j < in->out_ptr[op + 1]; j++) {
                i64 u = in->out_idx[j];
                start = dmax(start, seg_max(&g, in->out_off[u], in->out_off[u] + in->size[u]));
            }
            double end = start + in->op_ms[op];
            /* what waits for "after this op" waits for the compute stream up to here too (replay.py) */
            op_end[bucket - 1] = last_end = in->net[op] ? dmax(end, compute) : end;
            if (in->net[op]) {  /* (the compute stream's order implies its own reads are done by a free) */
                net = link = end;
                for (i64 j = in->in_ptr[op]; j < in->in_ptr[op + 1]; j++)
                    net_read[in->in_idx[j]] = dmax(net_read[in->in_idx[j]], end);
            } else {
                compute = end;
            }
            for (i64 j = in->out_ptr[op]; j < in->out_ptr[op + 1]; j++) {
                i64 u = in->out_idx[j];
                where[u] = in->out_off[u], ready[u] = end;
            }
        } else if (kind == SWAP_IN) {
            double start = dmax(dmax(h2d_clock, after),
                                dmax(seg_max(&g, offset, offset + in->size[t]), host_ready[t]));
            h2d_clock = ready[t] = start + 1e3 * (latency + (double)in->nbytes[t] / h2d_bw);
            if (!out_ever[t]) in->copy_done[t] = ready[t];
            where[t] = offset;
            h2d += in->nbytes[t];
        } else if (kind == SWAP_OUT) {
            double start = dmax(dmax(d2h_clock, after), ready[t]);
            d2h_clock = host_ready[t] = copied_out[t] = in->copy_done[t] =
                start + 1e3 * (latency + (double)in->nbytes[t] / d2h_bw);
            out_ever[t] = 1;
            d2h += in->nbytes[t];
        } else {
            double when = dmax(dmax(after, copied_out[t]), dmax(ready[t], net_read[t]));
            seg_assign(&g, where[t], where[t] + in->size[t], when);
            copied_out[t] = net_read[t] = 0.0;
            where[t] = -1;
        }
        host_ops(in, i, &next_host, &host, &link, host_ready);
    }
    host_ops(in, n_ord, &next_host, &host, &link, host_ready);
    *in->host_clock = host;
    *ms = dmax(dmax(dmax(compute, net), dmax(h2d_clock, d2h_clock)), host), *h2d_out = h2d, *d2h_out = d2h;
    status = 0;
done:
    free(order), free(where), free(times), free(out_ever);
    segs_free(&g);
    return status;
}

/* -- Python bindings. Arguments are described by a spec, one letter each: q an int64 array, w a writable
   one, d a float64 array, b a bool (one-byte) array, n an int. */

#define MAX_ARGS 24
typedef struct {
    Py_buffer buf[MAX_ARGS];
    int held;
    void *ptr[MAX_ARGS];
    i64 len[MAX_ARGS], num[MAX_ARGS];
} Args;

static void args_release(Args *a) {
    for (int i = 0; i < a->held; i++) PyBuffer_Release(&a->buf[i]);
    a->held = 0;
}

static int args_parse(PyObject *tuple, const char *spec, Args *a) {
    Py_ssize_t n = (Py_ssize_t)strlen(spec);
    a->held = 0;
    if (PyTuple_GET_SIZE(tuple) != n) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", n, PyTuple_GET_SIZE(tuple));
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(tuple, i);
        char c = spec[i];
        if (c == 'n') {
            a->num[i] = PyLong_AsLongLong(o);
            if (a->num[i] == -1 && PyErr_Occurred()) goto fail;
            continue;
        }
        Py_buffer *b = &a->buf[a->held];
        if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (c == 'w' ? PyBUF_WRITABLE : 0)) < 0) goto fail;
        a->held++;
        Py_ssize_t item = c == 'b' ? 1 : 8;
        if (b->itemsize != item) {
            PyErr_Format(PyExc_TypeError, "argument %zd: expected items of %zd bytes, got %zd", i, item, b->itemsize);
            goto fail;
        }
        a->ptr[i] = b->buf;
        a->len[i] = b->len / item;
    }
    return 0;
fail:
    args_release(a);
    return -1;
}

/* Whether a CSR of n rows (ptr: n_ptr entries) disagrees with its n_idx indices, each below `below`. */
static int csr_bad(const i64 *ptr, i64 n_ptr, i64 n, const i64 *idx, i64 n_idx, i64 below) {
    if (n_ptr != n + 1 || ptr[0] != 0 || ptr[n] != n_idx) return 1;
    for (i64 r = 0; r < n; r++)
        if (ptr[r + 1] < ptr[r]) return 1;
    for (i64 j = 0; j < n_idx; j++)
        if (idx[j] < 0 || idx[j] >= below) return 1;
    return 0;
}

/* Whether the tensors' host-copy sources disagree: their pointers, or an op index below 0. */
static int after_bad(const Inputs *in, i64 n_idx) {
    return in->n_after < 0 || in->n_after > in->n_t ||
           csr_bad(in->after_ptr, in->n_after + 1, in->n_after, in->after_idx, n_idx, INT64_MAX);
}

static PyObject *py_plan(PyObject *self, PyObject *tuple) {
    (void)self;
    Args a;
    if (args_parse(tuple, "qnbqqqqqqbbbbqqqnnnwwwqq", &a) < 0) return NULL;
    Inputs in = {
        .schedule = a.ptr[0], .n_ops = a.len[0], .cap = a.num[1], .pinned0 = a.ptr[2], .policy = a.ptr[3],
        .size = a.ptr[4], .n_t = a.len[4], .in_ptr = a.ptr[5], .in_idx = a.ptr[6], .out_ptr = a.ptr[7],
        .out_idx = a.ptr[8], .in_place = a.ptr[9], .is_input = a.ptr[10], .persistent = a.ptr[11],
        .fwd_act = a.ptr[12], .upd_old = a.ptr[13], .n_upd = a.len[13], .upd_new = a.ptr[14], .by_name = a.ptr[15],
        .n_by_name = a.len[15],
        .loss = a.num[16], .width = a.num[17], .rank_gaps = a.num[18], .out_off = a.ptr[21],
        .after_ptr = a.ptr[22], .n_after = a.len[22] - 1, .after_idx = a.ptr[23],
    };
    i64 *room = a.ptr[19], *recs = a.ptr[20], nrec = 0, peak = 0;
    int status;
    if (a.len[3] < P_FIELDS || a.len[19] < 3 || a.len[21] < in.n_t || a.len[2] < in.n_t || after_bad(&in, a.len[23])) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "plan: an array is shorter than the problem");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = plan(&in, recs, a.len[20] / 5, room, &nrec, &peak);
    Py_END_ALLOW_THREADS
    args_release(&a);
    if (status < 0) return PyErr_NoMemory();
    return Py_BuildValue("LLi", (long long)nrec, (long long)peak, status);
}

/* Whether the host lane's arrays disagree: lengths, positions in lane order, copies' indices. */
static int host_lane_bad(const SimInputs *in, i64 n_idx, i64 n_ptr, i64 n_ms, i64 n_coll, i64 n_clock) {
    if (n_ms != in->n_host || n_coll != in->n_host || n_clock != 1 ||
        csr_bad(in->host_cp_ptr, n_ptr, in->n_host, in->host_cp_idx, n_idx, in->n_t))
        return 1;
    for (i64 h = 0; h < in->n_host; h++)
        if ((h && in->host_at[h] < in->host_at[h - 1]) || in->host_at[h] < -1 || in->host_at[h] >= in->n_rec) return 1;
    return 0;
}

static PyObject *py_simulate(PyObject *self, PyObject *tuple) {
    (void)self;
    Args a;
    if (args_parse(tuple, "qqnqnqqqqqdqddwbqqqdbwqq", &a) < 0) return NULL;
    SimInputs in = {
        .schedule = a.ptr[0], .n_ops = a.len[0], .recs = a.ptr[1], .n_rec = a.num[2], .out_off = a.ptr[3],
        .n_t = a.len[3], .top = a.num[4], .size = a.ptr[5], .in_ptr = a.ptr[6], .in_idx = a.ptr[7],
        .out_ptr = a.ptr[8], .out_idx = a.ptr[9], .op_ms = a.ptr[10], .nbytes = a.ptr[11], .copy = a.ptr[12],
        .host_start = a.ptr[13], .copy_done = a.ptr[14], .net = a.ptr[15], .host_at = a.ptr[16],
        .n_host = a.len[16], .host_cp_ptr = a.ptr[17], .host_cp_idx = a.ptr[18], .host_ms = a.ptr[19],
        .host_coll = a.ptr[20], .host_clock = a.ptr[21], .host_out_ptr = a.ptr[22], .host_out_idx = a.ptr[23],
    };
    double ms = 0.0;
    i64 h2d = 0, d2h = 0;
    int status;
    if (a.len[15] < in.n_ops) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "simulate: net needs a flag per op");
        return NULL;
    }
    if (host_lane_bad(&in, a.len[18], a.len[17], a.len[19], a.len[20], a.len[21]) ||
        csr_bad(in.host_out_ptr, a.len[22], in.n_host, in.host_out_idx, a.len[23], in.n_t)) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "simulate: the host lane's arrays do not agree");
        return NULL;
    }
    if (a.len[13] < in.n_t || a.len[14] < in.n_t) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "simulate: host_start and copy_done need a value per tensor");
        return NULL;
    }
    if (in.n_rec * 5 > a.len[1]) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "simulate: fewer records than asked for");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = simulate(&in, &ms, &h2d, &d2h);
    Py_END_ALLOW_THREADS
    args_release(&a);
    if (status < 0) return PyErr_NoMemory();
    return Py_BuildValue("dLL", ms, (long long)h2d, (long long)d2h);
}

/* -- the schedule a genome's priorities make: the topological order that always runs the ready op of
   highest priority (ties: the lowest index), with a binary heap of ready ops */

static inline int before(const double *priority, i64 a, i64 b) {
    return priority[a] > priority[b] || (priority[a] == priority[b] && a < b);
}

static void ready_push(i64 *heap, i64 *size, i64 op, const double *priority) {
    i64 i = (*size)++;
    heap[i] = op;
    while (i > 0 && before(priority, heap[i], heap[(i - 1) / 2])) {
        i64 up = (i - 1) / 2, x = heap[i];
        heap[i] = heap[up], heap[up] = x, i = up;
    }
}

static i64 ready_pop(i64 *heap, i64 *size, const double *priority) {
    i64 top = heap[0], n = --(*size), j = 0;
    heap[0] = heap[n];
    for (;;) {
        i64 s = j, left = 2 * j + 1, right = 2 * j + 2;
        if (left < n && before(priority, heap[left], heap[s])) s = left;
        if (right < n && before(priority, heap[right], heap[s])) s = right;
        if (s == j) return top;
        i64 x = heap[s];
        heap[s] = heap[j], heap[j] = x, j = s;
    }
}

/* Writes the order to `order`; returns its length (short of n if the graph has a cycle), -1 if out of
   memory. */
static i64 priority_order(const double *priority, i64 n, const i64 *n_preds, const i64 *succ_ptr,
                          const i64 *succ_idx, i64 *order) {
    i64 *waiting = malloc(sizeof(i64) * (n + 1)), *heap = malloc(sizeof(i64) * (n + 1)), size = 0, done = 0;
    if (!waiting || !heap) {
        free(waiting), free(heap);
        return -1;
    }
    memcpy(waiting, n_preds, sizeof(i64) * n);
    for (i64 op = 0; op < n; op++)
        if (waiting[op] == 0) ready_push(heap, &size, op, priority);
    while (size > 0) {
        i64 top = ready_pop(heap, &size, priority);
        order[done++] = top;
        for (i64 k = succ_ptr[top]; k < succ_ptr[top + 1]; k++)
            if (--waiting[succ_idx[k]] == 0) ready_push(heap, &size, succ_idx[k], priority);
    }
    free(waiting), free(heap);
    return done;
}

static PyObject *py_priority_order(PyObject *self, PyObject *tuple) {
    (void)self;
    Args a;
    if (args_parse(tuple, "dqqqw", &a) < 0) return NULL;
    i64 n = a.len[0], done = -2;
    if (a.len[1] >= n && a.len[2] > n && a.len[4] >= n) {
        Py_BEGIN_ALLOW_THREADS
        done = priority_order(a.ptr[0], n, a.ptr[1], a.ptr[2], a.ptr[3], a.ptr[4]);
        Py_END_ALLOW_THREADS
    }
    args_release(&a);
    if (done == -1) return PyErr_NoMemory();
    if (done == -2) {
        PyErr_SetString(PyExc_ValueError, "priority_order: an array is shorter than the priorities");
        return NULL;
    }
    return PyLong_FromLongLong(done);
}

/* -- recomputation's clone positions (clones.Placer, held to clones.place_clones by a property test).
   Op indices are topological, so a forward reader comes after the op it reads: one pass from the last kept
   op back gives each its clone position, its first backward reader's or a kept forward reader's clone's if
   earlier. Rows end in the sentinel n (pos[n]: n for minima, -1 for the forward readers' maximum). */

typedef struct {
    const i64 *fw_ptr, *fw_idx, *bw_ptr, *bw_idx, *in_ptr, *consumer, *maker;
} CloneRows;

static i64 row_min(const i64 *ptr, const i64 *idx, i64 r, const i64 *pos) {
    i64 v = INT64_MAX;
    for (i64 e = ptr[r]; e < ptr[r + 1]; e++) v = pos[idx[e]] < v ? pos[idx[e]] : v;
    return v;
}

/* Keeps, of the ascending forward ops kept[0..k), those that can be cloned in the order `pos` gives (op ->
   position; pos[n] free for the sentinel), each clone's position in at[]; returns how many (kept[] and at[]
   rewritten from the front). need: n + 1 i64, in: n + 1 bytes. */
static i64 place_clones(const CloneRows *c, i64 n, i64 *pos, i64 *kept, i64 k, i64 *at, i64 *need, char *in) {
    for (;;) {
        memset(in, 0, (size_t)n + 1);
        for (i64 j = 0; j < k; j++) in[kept[j]] = 1;
        pos[n] = n;
        for (i64 j = k - 1; j >= 0; j--) {
            i64 m = kept[j], v = row_min(c->bw_ptr, c->bw_idx, m, pos);
            for (i64 e = c->fw_ptr[m]; e < c->fw_ptr[m + 1]; e++) {
                i64 r = c->fw_idx[e];
                if (r < n && in[r] && need[r] < v) v = need[r];
            }
            need[m] = v;
        }
        i64 good = 0;
        for (i64 j = 0; j < k; j++) {
            i64 m = kept[j], v = need[m], last = -1, first = n;
            for (i64 e = c->fw_ptr[m]; e < c->fw_ptr[m + 1]; e++)
                if (c->fw_idx[e] < n && pos[c->fw_idx[e]] > last) last = pos[c->fw_idx[e]];
            for (i64 e = c->in_ptr[m]; e < c->in_ptr[m + 1]; e++) {
                i64 u = c->consumer[e] < n && !in[c->maker[e]] ? pos[c->consumer[e]] : n;
                first = u < first ? u : first;
            }
            if (v < n && last < v && first >= v) {
                kept[good] = m;
                at[good++] = v;
            }
        }
        if (good == k) return k;
        k = good;
    }
}

static PyObject *py_place_clones(PyObject *self, PyObject *tuple) {
    (void)self; /* schedule, kept (ascending forward ops), at (out), fw_ptr, fw_idx, bw_ptr, bw_idx, in_ptr,
                   consumer, maker: how many kept */
    Args a;
    if (args_parse(tuple, "qwwqqqqqqq", &a) < 0) return NULL;
    i64 n = a.len[0], k = a.len[1], done = -1;
    CloneRows c = {a.ptr[3], a.ptr[4], a.ptr[5], a.ptr[6], a.ptr[7], a.ptr[8], a.ptr[9]};
    const i64 *schedule = a.ptr[0];
    int bad = a.len[2] < k || csr_bad(c.fw_ptr, a.len[3], n, c.fw_idx, a.len[4], n + 1) ||
              csr_bad(c.bw_ptr, a.len[5], n, c.bw_idx, a.len[6], n + 1) ||
              csr_bad(c.in_ptr, a.len[7], n, c.consumer, a.len[8], n + 1) || a.len[9] != a.len[8];
    for (i64 j = 0; !bad && j < a.len[9]; j++) bad = c.maker[j] < 0 || c.maker[j] > n;
    for (i64 j = 0; !bad && j < k; j++) bad = ((i64 *)a.ptr[1])[j] < 0 || ((i64 *)a.ptr[1])[j] >= n;
    for (i64 j = 0; !bad && j < n; j++) bad = schedule[j] < 0 || schedule[j] >= n;
    if (bad) {
        args_release(&a);
        PyErr_SetString(PyExc_ValueError, "place_clones: the rows, the schedule or the ops kept disagree");
        return NULL;
    }
    i64 *pos = malloc(sizeof(i64) * (size_t)(n + 1)), *need = malloc(sizeof(i64) * (size_t)(n + 1));
    char *in = malloc((size_t)n + 1);
    if (pos && need && in) {
        for (i64 j = 0; j < n; j++) pos[schedule[j]] = j;
        for (i64 j = 0; !bad && j < n; j++) bad = pos[schedule[j]] != j;  /* (a repeated op: no order) */
        done = bad ? -2 : place_clones(&c, n, pos, a.ptr[1], k, a.ptr[2], need, in);
    }
    free(pos);
    free(need);
    free(in);
    args_release(&a);
    if (done == -2) {
        PyErr_SetString(PyExc_ValueError, "place_clones: the schedule repeats an op");
        return NULL;
    }
    if (done < 0) return PyErr_NoMemory();
    return PyLong_FromLongLong(done);
}

/* -- test hooks: the free-position segments and the victim index, driven from Python so that property
   tests hold them to the readable versions (arena.Segments, a scan of the keys held) */

static PyObject *py_segments_replay(PyObject *self, PyObject *tuple) {
    (void)self; /* top, assignments (lo, hi, value) and queries (lo, hi) after each: the maxima */
    Args a;
    if (args_parse(tuple, "nqqdqqqw", &a) < 0) return NULL;
    i64 top = a.num[0], n_assign = a.len[1], n_query = a.len[4];
    const i64 *lo = a.ptr[1], *hi = a.ptr[2], *qlo = a.ptr[4], *qhi = a.ptr[5], *q_after = a.ptr[6];
    const double *v = a.ptr[3];
    double *out = a.ptr[7];
    Segs g = {0};
    int ok = segs_init(&g, top, 2, 0.0) == 0 && a.len[7] >= n_query && a.len[6] >= n_query;
    for (i64 i = 0, q = 0; ok && i < n_assign; i++) {
        ok = segs_reserve(&g) == 0;
        if (ok) seg_assign(&g, lo[i], hi[i], v[i]);
        for (; ok && q < n_query && q_after[q] == i; q++) out[q] = seg_max(&g, qlo[q], qhi[q]);
    }
    segs_free(&g);
    args_release(&a);
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_victims_replay(PyObject *self, PyObject *tuple) {
    (void)self; /* n_keys, moves (tensor, key; key -1: it leaves), asks (x) after each: best keys */
    Args a;
    if (args_parse(tuple, "nnqqqqw", &a) < 0) return NULL;
    i64 n_keys = a.num[0], n_t = a.num[1], n_move = a.len[2], n_ask = a.len[4];
    const i64 *mt = a.ptr[2], *mk = a.ptr[3], *ask = a.ptr[4], *ask_after = a.ptr[5];
    i64 *out = a.ptr[6];
    Planner S = {0}, *P = &S;
    P->tr = malloc(sizeof(Tensor) * (n_t + 1));
    int ok = P->tr && kh_alloc(P, n_keys + 1) == 0 && a.len[6] >= n_ask && a.len[5] >= n_ask;
    for (i64 t = 0; ok && t <= n_t; t++) P->tr[t].rk_key = -1;
    for (i64 i = 0, q = 0; ok && i < n_move; i++) {
        if (mk[i] < 0) rank_drop(P, mt[i]);
        else rank_add(P, mt[i], mk[i]);
        for (; q < n_ask && ask_after[q] == i; q++) out[q] = best_key(P, ask[q]);
    }
    free(P->tr), free(P->kh);
    args_release(&a);
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"place_clones", py_place_clones, METH_VARARGS,
     "place_clones(schedule, kept, at, fw_ptr, fw_idx, bw_ptr, bw_idx, in_ptr, consumer, maker) -> count"},
    {"priority_order", py_priority_order, METH_VARARGS,
     "priority_order(priority, n_preds, succ_ptr, succ_idx, order) -> ops written to order"},
    {"segments_replay", py_segments_replay, METH_VARARGS,
     "segments_replay(top, lo, hi, value, qlo, qhi, q_after, out): test hook, out[q] = the most over [qlo, qhi) "
     "after assignment q_after[q] (q_after ascending)"},
    {"victims_replay", py_victims_replay, METH_VARARGS,
     "victims_replay(n_keys, n_tensors, tensor, key, ask, ask_after, out): test hook, key -1 drops the tensor; "
     "out[q] = the best key at most ask[q] after move ask_after[q] (ascending)"},
    {"plan", py_plan, METH_VARARGS,
     "plan(schedule, cap, pinned, policy, size, in_ptr, in_idx, out_ptr, out_idx, in_place, is_input, persistent, "
     "fwd_act, upd_old, upd_new, by_name, loss, width, rank_gaps, room, recs, out_off, after_ptr, after_idx) "
     "-> (records, peak, status)"},
    {"simulate", py_simulate, METH_VARARGS,
     "simulate(schedule, recs, n_rec, out_off, top, size, in_ptr, in_idx, out_ptr, out_idx, op_ms, nbytes, copy, "
     "host_start, copy_done, net, host_at, host_cp_ptr, host_cp_idx, host_ms, host_coll, host_clock, host_out_ptr, "
     "host_out_idx) "
     "-> (iteration_ms, h2d_bytes, d2h_bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastplan", "The swap planner and simulator in C.", -1,
                                    methods, NULL, NULL, NULL, NULL};

/* The named constants, for Python to code a policy with and for a test to hold against plan/program.py. */
static int add_constants(PyObject *m) {
    PyObject *kinds = Py_BuildValue("{sisisisi}", "launch", LAUNCH, "swap_out", SWAP_OUT, "free", FREE,
                                    "swap_in", SWAP_IN);
    PyObject *status = Py_BuildValue("{sisisisisi}", "done", DONE, "no_room_fixed", NO_ROOM_FIXED, "no_room_tensor",
                                     NO_ROOM_TENSOR, "out_of_records", OUT_OF_RECORDS, "out_of_memory", OUT_OF_MEMORY);
    PyObject *fields = Py_BuildValue("(ssssss)", "victim", "prefetch", "offload", "outputs", "reserve", "horizon");
    PyObject *codes = Py_BuildValue("{s{sisi}s{sisisi}s{sisisi}}", "victim", "lru", VICTIM_LRU, "belady",
                                    VICTIM_BELADY, "prefetch", "none", PREFETCH_NONE, "earliest", PREFETCH_EARLIEST,
                                    "ahead", PREFETCH_AHEAD, "outputs", "oldest", OUTPUTS_OLDEST, "newest",
                                    OUTPUTS_NEWEST, "newest-backward", OUTPUTS_NEWEST_BACKWARD);
    int ok = kinds && status && fields && codes && PyModule_AddObjectRef(m, "INSTR_KINDS", kinds) == 0 &&
             PyModule_AddObjectRef(m, "STATUS", status) == 0 &&
             PyModule_AddObjectRef(m, "POLICY_FIELDS", fields) == 0 &&
             PyModule_AddObjectRef(m, "POLICY_CODES", codes) == 0;
    Py_XDECREF(kinds), Py_XDECREF(status), Py_XDECREF(fields), Py_XDECREF(codes);
    return ok ? 0 : -1;
}

PyMODINIT_FUNC PyInit__fastplan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && add_constants(m) < 0) Py_CLEAR(m);
    return m;
}
