/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hdims.h - the head dims the CUDA kernels are compiled for, as one X-macro: FA_HDIMS(X) expands X(d) for each,
 * ascending. All of 32, 64, 96, 128, 192, 256, or those a build names (make FA_HDIMS="64 128" compiles only their
 * instance files and passes -DFA_HDIMS_SUBSET -DFA_HDIM_64 -DFA_HDIM_128). Every switch, declaration list and
 * message about head dims is made from it (FA_HAS_HDIM_d, 0 or 1, where the preprocessor must test one), and
 * fa_build_info() reports it ("hdims=32,64,..."), which is where the Python binding's padding rule reads it.
 * Plain preprocessor: C and CUDA include it alike.
 */
#ifndef FLASHATTN_CUDA_HDIMS_H
#define FLASHATTN_CUDA_HDIMS_H

#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_32)
#define FA_HAS_HDIM_32 1
#define FA_HDIM_X32(X) X(32)
#else
#define FA_HAS_HDIM_32 0
#define FA_HDIM_X32(X)
#endif
#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_64)
#define FA_HAS_HDIM_64 1
#define FA_HDIM_X64(X) X(64)
#else
#define FA_HAS_HDIM_64 0
#define FA_HDIM_X64(X)
#endif
#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_96)
#define FA_HAS_HDIM_96 1
#define FA_HDIM_X96(X) X(96)
#else
#define FA_HAS_HDIM_96 0
#define FA_HDIM_X96(X)
#endif
#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_128)
#define FA_HAS_HDIM_128 1
#define FA_HDIM_X128(X) X(128)
#else
#define FA_HAS_HDIM_128 0
#define FA_HDIM_X128(X)
#endif
#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_192)
#define FA_HAS_HDIM_192 1
#define FA_HDIM_X192(X) X(192)
#else
#define FA_HAS_HDIM_192 0
#define FA_HDIM_X192(X)
#endif
#if !defined(FA_HDIMS_SUBSET) || defined(FA_HDIM_256)
#define FA_HAS_HDIM_256 1
#define FA_HDIM_X256(X) X(256)
#else
#define FA_HAS_HDIM_256 0
#define FA_HDIM_X256(X)
#endif

/* The FA2 forward and backward: every compiled head dim. */
#define FA_HDIMS(X) FA_HDIM_X32(X) FA_HDIM_X64(X) FA_HDIM_X96(X) FA_HDIM_X128(X) FA_HDIM_X192(X) FA_HDIM_X256(X)
/* The FA3 forward: those of 64, 128 and 256 that are compiled. */
#define FA3_HDIMS(X) FA_HDIM_X64(X) FA_HDIM_X128(X) FA_HDIM_X256(X)
/* The FA3 backward: those of 64 and 128 that are compiled. */
#define FA3_BWD_HDIMS(X) FA_HDIM_X64(X) FA_HDIM_X128(X) FA_HDIM_X256(X)

/* The lists as string literals for messages: " 32 64 96 128 192 256" (a leading space). */
#define FA_HDIM_WORD_(D)  " " #D
#define FA_HDIMS_STR      FA_HDIMS(FA_HDIM_WORD_)
#define FA3_HDIMS_STR     FA3_HDIMS(FA_HDIM_WORD_)
#define FA3_BWD_HDIMS_STR FA3_BWD_HDIMS(FA_HDIM_WORD_)

#endif /* FLASHATTN_CUDA_HDIMS_H */
