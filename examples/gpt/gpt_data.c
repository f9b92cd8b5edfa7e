/*
 * gpt_data.c: the token shard and the micro-batches of train_gpt (gpt_data.h).
 */
#include "gpt_data.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int gpt_shard_open(const char *path, int vocab, struct gpt_shard *s, char *msg, size_t msg_len) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot open the token shard %s", path);
        return 0;
    }
    struct stat st;
    int32_t header[256];
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof header ||
        pread(fd, header, sizeof header, 0) != (ssize_t)sizeof header) {
        snprintf(msg, msg_len, "%s: shorter than the 1024-byte shard header", path);
        close(fd);
        return 0;
    }
    if (header[0] != 20240520 || header[1] != 1) {
        snprintf(msg, msg_len, "%s: not a token shard (magic %d, version %d; expected 20240520, 1)", path,
                 header[0], header[1]);
        close(fd);
        return 0;
    }
    const int64_t ntok = header[2];
    if (ntok < 1 || (off_t)(sizeof header + (size_t)ntok * 2) != st.st_size) {
        snprintf(msg, msg_len, "%s: the header says %lld tokens, the file holds %lld bytes after it", path,
                 (long long)ntok, (long long)(st.st_size - (off_t)sizeof header));
        close(fd);
        return 0;
    }
    s->map_len = (size_t)st.st_size;
    s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        snprintf(msg, msg_len, "%s: mmap failed", path);
        return 0;
    }
    s->tokens = (const uint16_t *)((const char *)s->map + sizeof header);
    s->ntok = ntok;
    for (int64_t i = 0; i < ntok; ++i)
        if (s->tokens[i] >= vocab) {
            snprintf(msg, msg_len, "%s: token %lld is %u, outside the vocabulary of %d", path, (long long)i,
                     s->tokens[i], vocab);
            return 0;
        }
    return 1;
}

void gpt_shard_close(struct gpt_shard *s) {
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

dsm_status_t gpt_loader_start(struct gpt_loader *ld, const struct gpt_shard *data, dsm_sampler_t sampler,
                              int64_t samples) {
    memset(ld, 0, sizeof *ld);
    ld->data = data, ld->sampler = sampler;
    dsm_status_t st = samples >= 0 ? dsm_sampler_resume(sampler, samples, &ld->epoch) : DSM_SUCCESS;
    if (st != DSM_SUCCESS) return st;
    return dsm_sampler_epoch_batches(sampler, ld->epoch, &ld->epoch_batches);
}

dsm_status_t gpt_loader_next(struct gpt_loader *ld, int B, int T, int P, int sp_rank, int64_t *idx,
                             int64_t *seqs, size_t N, int64_t *tok, int64_t *pos, int64_t *lab, int64_t *valid,
                             int64_t *samples) {
    int64_t count, chunk;
    dsm_status_t st = dsm_sampler_batch(ld->sampler, ld->epoch, ld->batch, idx, (size_t)B, &count);
    if (st != DSM_SUCCESS) return st;
    for (int64_t i = count; i < B; ++i) idx[i] = idx[i % count]; /* a short last batch: repeat its first */
    for (int i = 0; i < B; ++i)
        for (int t = 0; t < T; ++t) seqs[(size_t)i * T + t] = ld->data->tokens[idx[i] * T + t];
    if ((st = dsm_sp_shard_batch(P, sp_rank, B, T, seqs, NULL, NULL, 0, N, tok, pos, lab, &chunk, valid)))
        return st;
    *samples = 0;
    if ((st = dsm_sampler_position(ld->sampler, ld->epoch, ld->batch, samples))) return st;
    if (++ld->batch == ld->epoch_batches) {
        ++ld->epoch, ld->batch = 0;
        return dsm_sampler_epoch_batches(ld->sampler, ld->epoch, &ld->epoch_batches);
    }
    return DSM_SUCCESS;
}
