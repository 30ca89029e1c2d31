/*
 * harness.h - what every benchmark in tests/bench shares: random inputs, best-of-N timing, the
 * OpenBLAS sgemm baseline measured in the same run, and one child process per case so that each
 * case's peak RSS is its own.
 *
 *     int i = bench_child_case(argc, argv, NCASES);   // in a child: run case i, print seconds
 *     if (i >= 0) return run_case(i);
 *     double base = bench_sgemm_gflops(eng_cpu_count());
 *     double secs, rss_mb;
 *     if (bench_measure_case(0, &secs, &rss_mb) == 0) ...
 */
#ifndef ATTND_BENCH_HARNESS_H
#define ATTND_BENCH_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

/* CLOCK_MONOTONIC seconds. */
double bench_seconds(void);

/* n uniform floats in [-amp, amp) from a fixed seed, 64-byte aligned (free() them); exits when
 * memory runs out. */
float *bench_random_floats(size_t n, unsigned seed, float amp);

/* The best of at least three runs (and of at least `min_total` seconds of runs, at most 20),
 * after one warm-up; -1 when a run fails. */
typedef eng_status (*bench_fn)(void *ctx);
double bench_best_seconds(bench_fn fn, void *ctx, double min_total);

/* GFLOPS of a 2048^3 OpenBLAS sgemm on `threads` threads. */
double bench_sgemm_gflops(int threads);

/* The fastest of `reps` reads of a buffer of `bytes` (integers XOR-ed into four accumulators:
 * work the core does faster than memory delivers) split over `threads` threads, in seconds:
 * the time streaming that many bytes from wherever they sit between steps takes here. 0 when
 * the buffer cannot be had. */
double bench_stream_seconds(size_t bytes, int threads, int reps);

/* GFLOPS of an in-register multiply-add loop (no memory traffic) of the instruction set the
 * kernel set `kernels` computes with (avx512: zmm FMA; avx2: ymm FMA; generic: SSE2 multiply
 * and add, what portable C compiles to; openblas: the widest this CPU has), on `threads`
 * threads at once: the silicon's peak for that set, which the benchmarks divide by. */
double bench_peak_gflops(const char *kernels, int threads);

/* GFLOPS of a TDPBF16PS loop on resident AMX tiles on `threads` threads at once: the tiles'
 * peak. 0, with the reason in why, where the CPU, the OS or the kernel does not grant the
 * tiles. */
double bench_tile_peak_gflops(int threads, char *why, size_t len);

/* Whether the bf16 products the engine runs have a peak loop: a register VDPBF16PS loop on
 * that path, or the set's fp32 FMA loop where bf16 operands are rounded for the fp32 kernel;
 * false when the set computes bf16 requests in float32 (openblas). */
bool bench_peak_bf16_exists(void);

/* bench_best_seconds (but up to 60 runs: a short case spans `min_total` seconds of the
 * machine's swings too), with one shot of the peak loop (bench_peak_gflops's for the process's
 * kernel set, or the bf16 products' loop when bf16) before each timed run, on `threads`
 * threads: *peak_gflops is the best shot. The machine is shared and its speed drifts by tens
 * of percent within a minute; taken in turns, the case's best run and the loop's best shot
 * come from the same minutes, so their ratio compares like with like. -1 (and *peak_gflops
 * 0) when a run fails or bf16 has no loop. */
double bench_best_seconds_and_peak(bench_fn fn, void *ctx, double min_total, bool bf16, int threads,
                                   double *peak_gflops);

/* The fastest OpenBLAS core that computes a correct 2048^3 sgemm here, on the threads that
 * bench_child_blas is given:
 * each core is tried in a child process (this program re-executed with --blas-core NAME)
 * with OPENBLAS_CORETYPE=NAME, since OpenBLAS reads the variable once, when it loads. Writes
 * the core's name; returns its GFLOPS, 0 when none worked. Benchmarks only: tests and the
 * daemon leave OPENBLAS_CORETYPE as the environment sets it. */
double bench_blas_best_gflops(char *core, size_t core_len);

/* When argv is "--blas-core NAME" (this program run by bench_blas_best_gflops): measures the
 * sgemm, prints its GFLOPS (0 when its result is wrong) and returns the exit status; else -1. */
int bench_child_blas(int argc, char **argv, int threads);

/* When argv is "--case N" (this program run as a child): N, or -2 when N is not a case.
 * Otherwise -1. */
int bench_child_case(int argc, char **argv, int ncases);

/* Runs this program as "--case i" in a fresh process, which prints its seconds on stdout;
 * returns 0 with the seconds and the child's peak RSS in MiB, or -1. */
int bench_measure_case(int i, double *secs, double *rss_mb);

/* The same for a child that prints up to n numbers on its line (say, two timings taken in
 * turns in one process): returns how many it read, or -1. */
int bench_measure_case_values(int i, double *values, int n, double *rss_mb);

#endif
