/*
 * gpt_shard: write an llm.c token shard for train_gpt.
 *
 *   gpt_shard --text FILE OUT.bin          byte-level tokens of any file (vocabulary 256)
 *   gpt_shard --synthetic N OUT.bin [--vocab V] [--seed S]
 *                                          N tokens of a learnable sequence
 *
 * The shard: a header of 256 int32 (magic 20240520, version 1, the token
 * count, zeros), then the tokens as uint16 (llm.c's layout, so its data
 * preparation scripts' files work as they are).
 *
 * The synthetic sequence is a first-order Markov chain over V tokens
 * (default 256): after token a comes next[a] with probability 0.9, else a
 * uniform token. A model that learns the table reaches a loss near
 * -0.9 ln(0.9 + 0.1/V) - 0.1 (V-1)/V ln(0.1/V), about 0.86 nats at V = 256,
 * from ln V = 5.55 at the start.
 *
 * Exit status 0, or 1 with a message naming the bad argument or file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int write_shard(const char *path, const uint16_t *tokens, int64_t n) {
    if (n < 1 || n > INT32_MAX) {
        fprintf(stderr, "gpt_shard: %lld tokens; a shard holds 1 to %d\n", (long long)n, INT32_MAX);
        return 0;
    }
    int32_t header[256] = {20240520, 1, (int32_t)n};
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "gpt_shard: cannot write %s\n", path);
        return 0;
    }
    int ok = fwrite(header, sizeof header, 1, f) == 1 && fwrite(tokens, 2, (size_t)n, f) == (size_t)n;
    ok = fclose(f) == 0 && ok;
    if (!ok) fprintf(stderr, "gpt_shard: writing %s failed\n", path);
    return ok;
}

static long parse_pos(const char *s, const char *what) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || end == s || v < 1) {
        fprintf(stderr, "gpt_shard: %s must be a positive integer, got \"%s\"\n", what, s);
        return -1;
    }
    return v;
}

int main(int argc, char **argv) {
    const char *usage = "usage: gpt_shard --text FILE OUT.bin | --synthetic N OUT.bin [--vocab V] [--seed S]\n";
    if (argc >= 4 && strcmp(argv[1], "--text") == 0 && argc == 4) {
        FILE *f = fopen(argv[2], "rb");
        if (!f) {
            fprintf(stderr, "gpt_shard: cannot open %s\n", argv[2]);
            return 1;
        }
        size_t cap = 1 << 20, n = 0;
        uint16_t *tok = malloc(cap * sizeof *tok);
        int ch;
        while (tok && (ch = fgetc(f)) != EOF) {
            if (n == cap) {
                uint16_t *t = realloc(tok, 2 * cap * sizeof *tok);
                if (!t) free(tok);
                tok = t, cap *= 2;
                if (!tok) break;
            }
            tok[n++] = (uint16_t)ch;
        }
        fclose(f);
        if (!tok) {
            fprintf(stderr, "gpt_shard: out of memory\n");
            return 1;
        }
        int ok = write_shard(argv[3], tok, (int64_t)n);
        if (ok) printf("gpt_shard: %zu byte tokens of %s written to %s\n", n, argv[2], argv[3]);
        free(tok);
        return ok ? 0 : 1;
    }
    if (argc >= 4 && strcmp(argv[1], "--synthetic") == 0) {
        const long n = parse_pos(argv[2], "N");
        long vocab = 256, seed = 1;
        for (int a = 4; a < argc; a += 2) {
            if (a + 1 >= argc) {
                fprintf(stderr, "gpt_shard: %s needs a value\n%s", argv[a], usage);
                return 1;
            }
            if (strcmp(argv[a], "--vocab") == 0) vocab = parse_pos(argv[a + 1], "--vocab");
            else if (strcmp(argv[a], "--seed") == 0) seed = parse_pos(argv[a + 1], "--seed");
            else {
                fprintf(stderr, "gpt_shard: unknown option \"%s\"\n%s", argv[a], usage);
                return 1;
            }
        }
        if (n < 0 || vocab < 0 || seed < 0) return 1;
        if (vocab < 2 || vocab > 65536) {
            fprintf(stderr, "gpt_shard: --vocab must be 2..65536, got %ld\n", vocab);
            return 1;
        }
        uint16_t *tok = malloc((size_t)n * sizeof *tok), *next = malloc((size_t)vocab * sizeof *next);
        if (!tok || !next) {
            fprintf(stderr, "gpt_shard: out of memory\n");
            return 1;
        }
        for (long a = 0; a < vocab; ++a) next[a] = (uint16_t)(mix64((uint64_t)seed * 7919u + (uint64_t)a) % (uint64_t)vocab);
        uint16_t cur = 0;
        for (long i = 0; i < n; ++i) {
            const uint64_t r = mix64(((uint64_t)seed << 40) ^ (uint64_t)i);
            cur = (r % 10u) != 0 ? next[cur] : (uint16_t)((r >> 8) % (uint64_t)vocab);
            tok[i] = cur;
        }
        int ok = write_shard(argv[3], tok, n);
        if (ok) printf("gpt_shard: %ld synthetic tokens (vocabulary %ld) written to %s\n", n, vocab, argv[3]);
        free(tok), free(next);
        return ok ? 0 : 1;
    }
    fputs(usage, stderr);
    return 1;
}
