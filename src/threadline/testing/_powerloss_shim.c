/* threadline power-loss recorder: an LD_PRELOAD shim (see _powerloss.py).
 *
 * For every path under THREADLINE_POWERLOSS_DIR it appends one record per
 * file operation to THREADLINE_POWERLOSS_TRACE: creations, writes with their
 * data and offset, truncations, syncs, renames, links, unlinks and closes.
 * Each record is taken under a process mutex and an flock of the trace, held
 * across the operation itself, so the records of all processes sharing the
 * trace are in the order the operations took effect. Files ending in "-shm"
 * (SQLite's wal-index, rebuilt on open) are not watched.
 *
 * Faults: THREADLINE_POWERLOSS_FAIL_SYNC=N fails the process's Nth sync of a
 * watched file or directory with EIO (without syncing); ..._KILL_SYNC=N
 * SIGKILLs the process just before its Nth. threadline_powerloss_arm() sets
 * either, counted from the call. threadline_powerloss_mark() records a marker.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { R_OPEN = 1, R_WRITE, R_TRUNC, R_SYNC, R_RENAME, R_LINK, R_UNLINK, R_CLOSE, R_MARK,
       R_KILL, R_UNSUPPORTED };

/* The record header, little-endian on the platforms this runs on; Python
 * reads it with struct "<IiqqQQIIQ". Then path1, path2, data. */
struct rec {
    uint32_t kind;
    int32_t pid;
    int64_t a, b;
    uint64_t dev, ino;
    uint32_t len1, len2;
    uint64_t len3;
};

struct ent { int used, isdir, append; dev_t dev; ino_t ino; };

#define MAXFD 16384
#define PATHBUF (2 * PATH_MAX)

static char watch[PATH_MAX];
static size_t watch_len;
static char trace_path[PATH_MAX];
static int trace_fd = -1;
static int active;
static struct ent table[MAXFD];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long syncs, fail_at, kill_at;
static pid_t owner; /* a vfork child shares our memory: it must not touch the table */

#define REAL(name, ret, ...)                                                 \
    static ret (*real_##name)(__VA_ARGS__);                                  \
    static ret (*get_##name(void))(__VA_ARGS__) {                            \
        if (!real_##name) *(void **)&real_##name = dlsym(RTLD_NEXT, #name);  \
        return real_##name;                                                  \
    }

REAL(openat, int, int, const char *, int, ...)
REAL(write, ssize_t, int, const void *, size_t)
REAL(writev, ssize_t, int, const struct iovec *, int)
REAL(pwrite64, ssize_t, int, const void *, size_t, off_t)
REAL(pwritev64, ssize_t, int, const struct iovec *, int, off_t)
REAL(pwritev64v2, ssize_t, int, const struct iovec *, int, off_t, int)
REAL(ftruncate64, int, int, off_t)
REAL(truncate64, int, const char *, off_t)
REAL(fsync, int, int)
REAL(fdatasync, int, int)
REAL(renameat2, int, int, const char *, int, const char *, unsigned)
REAL(linkat, int, int, const char *, int, const char *, int)
REAL(unlinkat, int, int, const char *, int)
REAL(close, int, int)
REAL(dup, int, int)
REAL(dup2, int, int, int)
REAL(dup3, int, int, int, int)
REAL(close_range, int, unsigned, unsigned, int)
REAL(fcntl64, int, int, int, ...)
REAL(mmap64, void *, void *, size_t, int, int, int, off_t)
REAL(copy_file_range, ssize_t, int, off_t *, int, off_t *, size_t, unsigned)
REAL(sendfile64, ssize_t, int, int, off_t *, size_t)
REAL(fallocate64, int, int, int, off_t, off_t)

static void open_trace(void) {
    trace_fd = get_openat()(AT_FDCWD, trace_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void before_fork(void) { pthread_mutex_lock(&mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&mu); }
static void after_fork_child(void) {
    /* The inherited descriptor shares the parent's flock: take one of our own. */
    if (trace_fd >= 0) {
        get_close()(trace_fd);
        open_trace();
    }
    owner = getpid();
    pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void init(void) {
    const char *dir = getenv("THREADLINE_POWERLOSS_DIR");
    const char *trace = getenv("THREADLINE_POWERLOSS_TRACE");
    if (!dir || !trace || !*dir || strlen(dir) >= PATH_MAX || strlen(trace) >= PATH_MAX) return;
    strcpy(watch, dir);
    watch_len = strlen(watch);
    while (watch_len > 1 && watch[watch_len - 1] == '/') watch[--watch_len] = 0;
    strcpy(trace_path, trace);
    open_trace();
    if (trace_fd < 0) return;
    const char *n = getenv("THREADLINE_POWERLOSS_FAIL_SYNC");
    if (n) fail_at = atol(n);
    n = getenv("THREADLINE_POWERLOSS_KILL_SYNC");
    if (n) kill_at = atol(n);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    owner = getpid();
    active = 1;
}

static void lock(void) {
    pthread_mutex_lock(&mu);
    flock(trace_fd, LOCK_EX);
}

static void unlock(void) {
    flock(trace_fd, LOCK_UN);
    pthread_mutex_unlock(&mu);
}

/* One record, in one writev where it can be (so that a process killed from
 * outside rarely leaves half a record); the lock keeps its pieces together. */
static void emit(uint32_t kind, int64_t a, int64_t b, dev_t dev, ino_t ino, const char *p1,
                 const char *p2, const struct iovec *data, int ndata, uint64_t len3) {
    struct rec r = {kind, (int32_t)getpid(), a, b, dev, ino, p1 ? (uint32_t)strlen(p1) : 0,
                    p2 ? (uint32_t)strlen(p2) : 0, len3};
    struct iovec v[IOV_MAX];
    int n = 0;
    v[n].iov_base = &r, v[n++].iov_len = sizeof r;
    v[n].iov_base = (void *)p1, v[n++].iov_len = r.len1;
    v[n].iov_base = (void *)p2, v[n++].iov_len = r.len2;
    for (int i = 0; i < ndata; i++) v[n++] = data[i]; /* ndata <= IOV_MAX - 3: see wrote() */
    for (int i = 0; i < n;) {
        ssize_t k = get_writev()(trace_fd, v + i, n - i);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) abort(); /* a trace with a hole would prove nothing */
        for (; i < n && (size_t)k >= v[i].iov_len; i++) k -= (ssize_t)v[i].iov_len;
        if (i < n) v[i].iov_base = (char *)v[i].iov_base + k, v[i].iov_len -= (size_t)k;
    }
}

/* Absolute, lexically normalised form of path (relative to dirfd) in out. */
static int absolute(int dirfd, const char *path, char *out) {
    char raw[PATHBUF];
    if (!path) return 0;
    if (path[0] == '/') {
        if (strlen(path) >= PATHBUF) return 0;
        strcpy(raw, path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) return 0;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t k = readlink(link, base, sizeof base - 1);
            if (k < 0) return 0;
            base[k] = 0;
        }
        if (strlen(base) + strlen(path) + 2 >= PATHBUF) return 0;
        strcpy(raw, base);
        strcat(raw, "/");
        strcat(raw, path);
    }
    size_t len = 0;
    char *save = NULL;
    for (char *part = strtok_r(raw, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (!strcmp(part, ".")) continue;
        if (!strcmp(part, "..")) {
            while (len > 0 && out[len - 1] != '/') len--;
            if (len > 0) len--;
            continue;
        }
        out[len++] = '/';
        strcpy(out + len, part);
        len += strlen(part);
    }
    if (!len) out[len++] = '/';
    out[len] = 0;
    return 1;
}

static int under(const char *abs) {
    size_t n = strlen(abs);
    if (strncmp(abs, watch, watch_len) || (abs[watch_len] && abs[watch_len] != '/')) return 0;
    return !(n >= 4 && !strcmp(abs + n - 4, "-shm"));
}

/* Whether path names something under the watched directory; its absolute form in out. */
static int watched_path(int dirfd, const char *path, char *out) {
    if (!active || !path) return 0;
    if (path[0] == '/' && strncmp(path, watch, watch_len)) return 0; /* the common case */
    return absolute(dirfd, path, out) && under(out);
}

static int watched_fd(int fd) {
    return active && fd >= 0 && fd < MAXFD && table[fd].used && getpid() == owner;
}

/* Under the lock: is fd still the file we watched (not closed behind our back)? */
static int still(int fd) {
    struct stat st;
    if (!table[fd].used) return 0;
    if (fstat(fd, &st) || st.st_dev != table[fd].dev || st.st_ino != table[fd].ino) {
        table[fd].used = 0;
        return 0;
    }
    return 1;
}

static void forget(int fd) {
    if (fd >= 0 && fd < MAXFD && getpid() == owner) table[fd].used = 0;
}

static void adopt(int fd, const char *abs, int flags, int existed) {
    struct stat st;
    if (fd < 0) return;
    if (fd >= MAXFD || fstat(fd, &st)) {
        emit(R_UNSUPPORTED, fd, 0, 0, 0, "descriptor out of range", abs, NULL, 0, 0);
        return;
    }
    int fl = get_fcntl64()(fd, F_GETFL);
    table[fd] = (struct ent){1, S_ISDIR(st.st_mode), fl >= 0 && (fl & O_APPEND), st.st_dev,
                             st.st_ino};
    int created = !existed && (flags & O_CREAT);
    int truncated = existed && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY &&
                    S_ISREG(st.st_mode);
    if (created || truncated || S_ISDIR(st.st_mode))
        emit(R_OPEN, created, truncated | (S_ISDIR(st.st_mode) ? 2 : 0), st.st_dev, st.st_ino,
             abs, NULL, NULL, 0, 0);
}

static int do_open(int dirfd, const char *path, int flags, mode_t mode) {
    char abs[PATHBUF];
    if (!watched_path(dirfd, path, abs)) {
        int fd = get_openat()(dirfd, path, flags, mode);
        if (active) forget(fd);
        return fd;
    }
    lock();
    if ((flags & O_TMPFILE) == O_TMPFILE)
        emit(R_UNSUPPORTED, 0, 0, 0, 0, "O_TMPFILE", abs, NULL, 0, 0);
    struct stat st;
    int existed = lstat(abs, &st) == 0;
    int fd = get_openat()(dirfd, path, flags, mode);
    int err = errno;
    if (fd >= 0) adopt(fd, abs, flags, existed);
    unlock();
    errno = err;
    return fd;
}

#define MODE_ARG(flags)                                                        \
    mode_t mode = 0;                                                           \
    if ((flags) & O_CREAT || ((flags) & O_TMPFILE) == O_TMPFILE) {             \
        va_list ap;                                                            \
        va_start(ap, flags);                                                   \
        mode = va_arg(ap, int);                                                \
        va_end(ap);                                                            \
    }

int open(const char *path, int flags, ...) { MODE_ARG(flags) return do_open(AT_FDCWD, path, flags, mode); }
int open64(const char *path, int flags, ...) { MODE_ARG(flags) return do_open(AT_FDCWD, path, flags, mode); }
int openat(int dirfd, const char *path, int flags, ...) { MODE_ARG(flags) return do_open(dirfd, path, flags, mode); }
int openat64(int dirfd, const char *path, int flags, ...) { MODE_ARG(flags) return do_open(dirfd, path, flags, mode); }
int __open_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0); }
int __openat64_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0); }
int creat(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

/* A write of n bytes of iov at offset (-1: at the position, which it moved). */
static void wrote(int fd, const struct iovec *iov, int cnt, ssize_t n, off_t offset) {
    struct stat st;
    if (n <= 0 || !still(fd)) return;
    if (offset < 0) offset = lseek(fd, 0, SEEK_CUR) - n; /* O_APPEND too: after our write */
    else if (table[fd].append && !fstat(fd, &st)) offset = st.st_size - n; /* Linux appends */
    struct iovec part[IOV_MAX - 3];
    int k = 0;
    size_t left = (size_t)n;
    char *joined = NULL;
    for (int i = 0; i < cnt && left; i++) {
        size_t take = iov[i].iov_len < left ? iov[i].iov_len : left;
        if (k == IOV_MAX - 3) break;
        part[k].iov_base = iov[i].iov_base, part[k++].iov_len = take;
        left -= take;
    }
    if (left) { /* more pieces than one writev takes: copy them into one */
        joined = malloc((size_t)n);
        if (!joined) abort();
        size_t at = 0;
        for (int i = 0; i < cnt && at < (size_t)n; i++) {
            size_t take = iov[i].iov_len < (size_t)n - at ? iov[i].iov_len : (size_t)n - at;
            memcpy(joined + at, iov[i].iov_base, take);
            at += take;
        }
        part[0].iov_base = joined, part[0].iov_len = (size_t)n, k = 1;
    }
    emit(R_WRITE, offset, 0, table[fd].dev, table[fd].ino, NULL, NULL, part, k, (uint64_t)n);
    free(joined);
}

#define WRITE_BODY(call, iov, cnt, offset)                                     \
    if (!watched_fd(fd)) return call;                                          \
    lock();                                                                    \
    ssize_t n = call;                                                          \
    int err = errno;                                                           \
    wrote(fd, iov, cnt, n, offset);                                            \
    unlock();                                                                  \
    errno = err;                                                               \
    return n;

ssize_t write(int fd, const void *buf, size_t count) {
    struct iovec one = {(void *)buf, count};
    WRITE_BODY(get_write()(fd, buf, count), &one, 1, -1)
}
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    WRITE_BODY(get_writev()(fd, iov, cnt), iov, cnt, -1)
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
    struct iovec one = {(void *)buf, count};
    WRITE_BODY(get_pwrite64()(fd, buf, count, off), &one, 1, off)
}
ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) {
    struct iovec one = {(void *)buf, count};
    WRITE_BODY(get_pwrite64()(fd, buf, count, off), &one, 1, off)
}
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    WRITE_BODY(get_pwritev64()(fd, iov, cnt, off), iov, cnt, off)
}
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    WRITE_BODY(get_pwritev64()(fd, iov, cnt, off), iov, cnt, off)
}
ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    WRITE_BODY(get_pwritev64v2()(fd, iov, cnt, off, flags), iov, cnt, off)
}
ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    WRITE_BODY(get_pwritev64v2()(fd, iov, cnt, off, flags), iov, cnt, off)
}

static int do_ftruncate(int fd, off_t length) {
    if (!watched_fd(fd)) return get_ftruncate64()(fd, length);
    lock();
    int r = get_ftruncate64()(fd, length), err = errno;
    if (r == 0 && still(fd)) emit(R_TRUNC, length, 0, table[fd].dev, table[fd].ino, NULL, NULL, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}
int ftruncate(int fd, off_t length) { return do_ftruncate(fd, length); }
int ftruncate64(int fd, off_t length) { return do_ftruncate(fd, length); }

static int do_truncate(const char *path, off_t length) {
    char abs[PATHBUF];
    if (!watched_path(AT_FDCWD, path, abs)) return get_truncate64()(path, length);
    lock();
    struct stat st;
    int r = stat(path, &st) ? -1 : get_truncate64()(path, length), err = errno;
    if (r == 0) emit(R_TRUNC, length, 0, st.st_dev, st.st_ino, abs, NULL, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}
int truncate(const char *path, off_t length) { return do_truncate(path, length); }
int truncate64(const char *path, off_t length) { return do_truncate(path, length); }

static int do_sync(int fd, int data_only) {
    int (*real)(int) = data_only ? get_fdatasync() : get_fsync();
    if (!watched_fd(fd)) return real(fd);
    long n = __atomic_add_fetch(&syncs, 1, __ATOMIC_SEQ_CST);
    lock();
    if (!still(fd)) {
        unlock();
        return real(fd);
    }
    if (n == kill_at) {
        emit(R_KILL, n, 0, table[fd].dev, table[fd].ino, NULL, NULL, NULL, 0, 0);
        kill(getpid(), SIGKILL);
    }
    int r, err;
    if (n == fail_at) {
        r = -1, err = EIO;
    } else {
        r = real(fd), err = errno;
    }
    emit(R_SYNC, data_only, r == 0 ? 0 : err, table[fd].dev, table[fd].ino, NULL, NULL, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}
int fsync(int fd) { return do_sync(fd, 0); }
int fdatasync(int fd) { return do_sync(fd, 1); }

/* rename and link: recorded when either name is watched (the other may be outside). */
static int two_paths(uint32_t kind, int olddir, const char *old, int newdir, const char *new_,
                     int flags, int (*call)(int, const char *, int, const char *, int)) {
    char a[PATHBUF], b[PATHBUF];
    int wa = watched_path(olddir, old, a), wb = watched_path(newdir, new_, b);
    if (!wa && !wb) return call(olddir, old, newdir, new_, flags);
    if (!wa) absolute(olddir, old, a);
    if (!wb) absolute(newdir, new_, b);
    lock();
    int r = call(olddir, old, newdir, new_, flags), err = errno;
    if (r == 0) emit(kind, flags, 0, 0, 0, a, b, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}

static int call_rename(int od, const char *o, int nd, const char *n, int flags) {
    return get_renameat2()(od, o, nd, n, (unsigned)flags);
}
static int call_link(int od, const char *o, int nd, const char *n, int flags) {
    return get_linkat()(od, o, nd, n, flags);
}

int rename(const char *o, const char *n) { return two_paths(R_RENAME, AT_FDCWD, o, AT_FDCWD, n, 0, call_rename); }
int renameat(int od, const char *o, int nd, const char *n) { return two_paths(R_RENAME, od, o, nd, n, 0, call_rename); }
int renameat2(int od, const char *o, int nd, const char *n, unsigned flags) { return two_paths(R_RENAME, od, o, nd, n, (int)flags, call_rename); }
int link(const char *o, const char *n) { return two_paths(R_LINK, AT_FDCWD, o, AT_FDCWD, n, 0, call_link); }
int linkat(int od, const char *o, int nd, const char *n, int flags) { return two_paths(R_LINK, od, o, nd, n, flags, call_link); }

static int do_unlink(int dirfd, const char *path, int flags) {
    char abs[PATHBUF];
    if (!watched_path(dirfd, path, abs)) return get_unlinkat()(dirfd, path, flags);
    lock();
    int r = get_unlinkat()(dirfd, path, flags), err = errno;
    if (r == 0) emit(R_UNLINK, flags, 0, 0, 0, abs, NULL, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}
int unlink(const char *path) { return do_unlink(AT_FDCWD, path, 0); }
int unlinkat(int dirfd, const char *path, int flags) { return do_unlink(dirfd, path, flags); }

int close(int fd) {
    if (!watched_fd(fd)) return get_close()(fd);
    lock();
    struct ent was = table[fd];
    forget(fd);
    int r = get_close()(fd), err = errno;
    if (r == 0) emit(R_CLOSE, 0, 0, was.dev, was.ino, NULL, NULL, NULL, 0, 0);
    unlock();
    errno = err;
    return r;
}

int close_range(unsigned first, unsigned last, int flags) {
    for (unsigned fd = first; active && fd <= last && fd < MAXFD; fd++) forget((int)fd);
    return get_close_range()(first, last, flags);
}

static int copied(int from, int to) {
    if (active && to >= 0 && to < MAXFD && getpid() == owner) {
        pthread_mutex_lock(&mu);
        if (watched_fd(from)) table[to] = table[from];
        else table[to].used = 0;
        pthread_mutex_unlock(&mu);
    }
    return to;
}
int dup(int fd) { return copied(fd, get_dup()(fd)); }
int dup2(int fd, int to) { return fd == to ? get_dup2()(fd, to) : copied(fd, get_dup2()(fd, to)); }
int dup3(int fd, int to, int flags) { return copied(fd, get_dup3()(fd, to, flags)); }

static int do_fcntl(int fd, int cmd, void *arg) {
    int r = get_fcntl64()(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) copied(fd, r);
    if (r >= 0 && cmd == F_SETFL && watched_fd(fd)) table[fd].append = !!((long)arg & O_APPEND);
    return r;
}
int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *); /* every command takes at most one int or pointer */
    va_end(ap);
    return do_fcntl(fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return do_fcntl(fd, cmd, arg);
}

/* Writes these make are not recorded: a trace that met one says so. */
static void unsupported(int fd, const char *what) {
    if (!watched_fd(fd)) return;
    lock();
    emit(R_UNSUPPORTED, fd, 0, table[fd].dev, table[fd].ino, what, NULL, NULL, 0, 0);
    unlock();
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if ((prot & PROT_WRITE) && (flags & MAP_SHARED)) unsupported(fd, "shared writable mmap");
    return get_mmap64()(addr, len, prot, flags, fd, off);
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}
ssize_t copy_file_range(int in, off_t *ioff, int out, off_t *ooff, size_t len, unsigned flags) {
    unsupported(out, "copy_file_range");
    return get_copy_file_range()(in, ioff, out, ooff, len, flags);
}
ssize_t sendfile(int out, int in, off_t *off, size_t count) {
    unsupported(out, "sendfile");
    return get_sendfile64()(out, in, off, count);
}
ssize_t sendfile64(int out, int in, off_t *off, size_t count) { return sendfile(out, in, off, count); }
int fallocate(int fd, int mode, off_t off, off_t len) {
    unsupported(fd, "fallocate");
    return get_fallocate64()(fd, mode, off, len);
}
int fallocate64(int fd, int mode, off_t off, off_t len) { return fallocate(fd, mode, off, len); }

int threadline_powerloss_mark(const char *text) {
    if (!active) return -1;
    lock();
    emit(R_MARK, 0, 0, 0, 0, text, NULL, NULL, 0, 0);
    unlock();
    return 0;
}

/* what: 1 fail, 2 kill; at the nth sync from now (0: never). */
int threadline_powerloss_arm(int what, long nth) {
    if (!active) return -1;
    long at = nth > 0 ? __atomic_load_n(&syncs, __ATOMIC_SEQ_CST) + nth : 0;
    if (what == 1) fail_at = at;
    else if (what == 2) kill_at = at;
    else return -1;
    return 0;
}
