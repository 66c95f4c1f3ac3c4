/* sim: a modelled device (--device sim:NAME). The engine, scheduler, KV manager, tokenizer and
 * sampling path run for real; the backend's ops compute nothing. Each op instead advances a
 * simulated device clock by the time a timer gives it (the host runs ahead, as with a GPU
 * stream), and the host waits for that clock, in real time, where it would synchronise with a
 * GPU (a download: be_to_host). Memory is counted against the modelled device's size, so a model
 * that does not fit is refused as on the device and the KV pool gets what is left; the weights are
 * never written (the mappings behind be_alloc are reserved, not committed: untouched pages cost
 * nothing). Greedy and sampled draws are deterministic ids from a pool the tokenizer can decode
 * (sim_set_tokens), never an end-of-sequence id unless the device asks for one (",eos=N").
 *
 * The timer is handed in from above: the backend floor does not know the cost model. A command
 * registers the function that turns a device spec into a timer (backend_sim_set_resolver), and
 * backend_open("sim:SPEC") calls it. */
#ifndef MOESERVE_BACKEND_SIM_H
#define MOESERVE_BACKEND_SIM_H

#include <stddef.h>

#include "../backend.h"

/* The modelled time of an op (op_seconds: rows = the op's token rows, wfmt = the weight format of
 * a GEMM or MoE op, QF_COUNT when it has none) and of a collective over ranks (comm_seconds;
 * bytes as backend.c and dist.c count them: what one rank sends), the device's memory and its
 * name for logs; step_seconds, a step's fixed cost on the device (paid at each download; 0: a
 * fixed 10 us a copy), and reserve_bytes, memory the runtime holds before the first allocation
 * (0: 1 GiB). */
typedef struct SimTimer {
    double (*op_seconds)(void *ctx, OpId op, double flops, double bytes, int rows, QFormat wfmt);
    double (*comm_seconds)(void *ctx, OpId op, double bytes, int ranks);
    void *ctx;
    double mem_bytes;
    double step_seconds;
    double reserve_bytes;
    const char *name;
} SimTimer;

/* spec: what follows "sim:" up to an optional ",option" (a device profile name or file); fills t,
 * or returns -1 with err saying why (an unknown name lists the known ones). */
typedef int (*SimResolver)(const char *spec, SimTimer *t, char *err, size_t errlen);
void backend_sim_set_resolver(SimResolver fn);

/* Open the sim backend for "sim:SPEC[,eos=N]": SPEC through the registered resolver. eos=N: one
 * draw in N (deterministically) is the end-of-sequence id given to sim_set_tokens, so that
 * outputs of varied lengths can be simulated; without it no draw is ever an end of sequence.
 * A bad spec is fatal, saying why. */
void backend_sim_open(Backend *be, const char *spec);
/* Open with a timer directly (tests). */
void backend_sim_init(Backend *be, const SimTimer *t);
int backend_is_sim(const Backend *be);

/* The ids draws come from: ids[n] (copied; ids the tokenizer decodes to text, no special or
 * end-of-sequence id), eos, the id a ",eos=N" draw returns (-1: none), and the model's vocabulary
 * (a download of whole logits rows, the host sampler's, gets each row's draw as its peak). Without
 * a pool the draws come from [V / 8, V / 2) of the logits' width V. */
void sim_set_tokens(Backend *be, const int *ids, int n, int eos, int vocab);
/* The id draw number `draw` gives row r (what be_argmax and be_sample write): a function of the
 * two alone, so that a run is repeatable. */
int sim_token(const Backend *be, long draw, int r, int vocab);

/* For the simulated collectives of src/dist: the device clock (seconds, clock_now's base), the
 * stream made to wait until t (a receive of what another simulated rank finishes then), the
 * ranks of the collective op that is counted next (1: it takes no time), the modelled seconds of
 * the stage's own work since the last call (its ops and collectives; pipeline sends and receives
 * excluded), and the timer itself. */
double sim_clock(const Backend *be);
void sim_wait_until(Backend *be, double t);
void sim_comm_ranks(Backend *be, int ranks);
double sim_take_busy(Backend *be);
const SimTimer *sim_timer(const Backend *be);
/* Bytes of simulated memory in use (weights, cache, activations); bytes uploaded so far. */
size_t sim_mem_used(const Backend *be);
double sim_uploaded(const Backend *be);

#endif
