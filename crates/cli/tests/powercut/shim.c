/*
 * A test-only LD_PRELOAD shim that records what a process writes and what
 * its syncs cover, so that a test can simulate a power cut afterwards:
 * every byte not covered by a completed fsync/fdatasync is lost (or, for
 * a torn write, partly kept), and every directory entry made after the
 * directory's last completed fsync may vanish. `crates/cli/tests/it/
 * powercut.rs` compiles it with `cc` and reads the log.
 *
 * The log (path in $CROSSBOOK_POWERCUT_LOG) is one line per event, fields
 * separated by tabs, each
 * written with a single write(2) on an O_APPEND descriptor, so lines from
 * different threads never interleave. Their order is the order in which
 * the calls completed (a sync's "B" line is written before the sync
 * starts):
 *
 *   O dev ino size path       a regular file opened (its size then)
 *   C path                    a file created by that open
 *   W dev ino offset length   bytes written
 *   A dev ino offset length   space allocated (posix_fallocate/fallocate)
 *   T dev ino length          a truncation
 *   B dev ino tid / E ...     a file sync begins / completed (by thread tid)
 *   DB tid path / DE tid path a directory sync begins / completed
 *   R old new                 a rename
 *   U path                    an unlink
 *
 * Paths are absolute (the directory part resolved with realpath).
 *
 * A failing disk, on request: while the file named by
 * $CROSSBOOK_SHIM_FAIL_SYNC_WHEN exists, a sync of a regular file whose
 * path contains $CROSSBOOK_SHIM_FAIL_SYNC fails with EIO (and is not
 * logged: it covered nothing).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int log_fd = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void open_log(void) {
    const char *path = getenv("CROSSBOOK_POWERCUT_LOG");
    if (path == NULL) return;
    log_fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

static void emit(const char *format, ...) {
    pthread_once(&log_once, open_log);
    if (log_fd < 0) return;
    char line[5 * PATH_MAX];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line, sizeof line - 1, format, args);
    va_end(args);
    if (n <= 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    int saved = errno;
    syscall(SYS_write, log_fd, line, (size_t)n);
    errno = saved;
}

#define REAL(name, ret, ...) \
    static ret (*real_##name)(__VA_ARGS__); \
    if (!real_##name) real_##name = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

/* The absolute form of `path`: its directory resolved, its name kept. */
#define FULL_PATH (2 * PATH_MAX)

static void absolute(const char *path, char *out) {
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    char *slash = strrchr(copy, '/');
    const char *name = path;
    char dir[PATH_MAX];
    if (slash == NULL) {
        snprintf(dir, sizeof dir, ".");
    } else if (slash == copy) {
        snprintf(dir, sizeof dir, "/");
        name = path + 1;
    } else {
        *slash = '\0';
        snprintf(dir, sizeof dir, "%s", copy);
        name = path + (slash - copy) + 1;
    }
    char resolved[PATH_MAX];
    if (realpath(dir, resolved) == NULL) {
        snprintf(out, FULL_PATH, "%s", path);
        return;
    }
    if (strcmp(resolved, "/") == 0) snprintf(out, FULL_PATH, "/%s", name);
    else snprintf(out, FULL_PATH, "%s/%s", resolved, name);
}

static int regular(int fd, struct stat *st) {
    if (fd == log_fd) return 0;
    return fstat(fd, st) == 0 && S_ISREG(st->st_mode);
}

static void opened(int fd, const char *path, int existed) {
    struct stat st;
    if (fd < 0 || !regular(fd, &st)) return;
    char full[FULL_PATH];
    absolute(path, full);
    if (!existed) emit("C\t%s", full);
    emit("O\t%lu\t%lu\t%lld\t%s", (unsigned long)st.st_dev, (unsigned long)st.st_ino, (long long)st.st_size, full);
}

static int exists(int dirfd, const char *path) {
    struct stat st;
    return fstatat(dirfd, path, &st, 0) == 0;
}

#define OPEN_BODY(call, dirfd) \
    mode_t mode = 0; \
    if (flags & (O_CREAT | O_TMPFILE)) { \
        va_list args; \
        va_start(args, flags); \
        mode = va_arg(args, mode_t); \
        va_end(args); \
    } \
    int existed = !(flags & O_CREAT) || exists(dirfd, path); \
    int fd = call; \
    if (fd >= 0) opened(fd, path, existed); \
    return fd;

int open(const char *path, int flags, ...) {
    REAL(open, int, const char *, int, ...);
    OPEN_BODY(real_open(path, flags, mode), AT_FDCWD)
}

int open64(const char *path, int flags, ...) {
    REAL(open64, int, const char *, int, ...);
    OPEN_BODY(real_open64(path, flags, mode), AT_FDCWD)
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL(openat, int, int, const char *, int, ...);
    OPEN_BODY(real_openat(dirfd, path, flags, mode), dirfd)
}

int openat64(int dirfd, const char *path, int flags, ...) {
    REAL(openat64, int, int, const char *, int, ...);
    OPEN_BODY(real_openat64(dirfd, path, flags, mode), dirfd)
}

static void wrote(int fd, long long offset, long long length) {
    struct stat st;
    if (length <= 0 || !regular(fd, &st)) return;
    emit("W\t%lu\t%lu\t%lld\t%lld", (unsigned long)st.st_dev, (unsigned long)st.st_ino, offset, length);
}

ssize_t write(int fd, const void *buffer, size_t count) {
    REAL(write, ssize_t, int, const void *, size_t);
    ssize_t n = real_write(fd, buffer, count);
    if (n > 0 && fd != log_fd) {
        int saved = errno;
        off_t end = lseek(fd, 0, SEEK_CUR);
        if (end >= 0) wrote(fd, (long long)end - n, n);
        errno = saved;
    }
    return n;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    REAL(writev, ssize_t, int, const struct iovec *, int);
    ssize_t n = real_writev(fd, iov, count);
    if (n > 0) {
        int saved = errno;
        off_t end = lseek(fd, 0, SEEK_CUR);
        if (end >= 0) wrote(fd, (long long)end - n, n);
        errno = saved;
    }
    return n;
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    REAL(pwrite, ssize_t, int, const void *, size_t, off_t);
    ssize_t n = real_pwrite(fd, buffer, count, offset);
    if (n > 0) wrote(fd, offset, n);
    return n;
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) {
    REAL(pwrite64, ssize_t, int, const void *, size_t, off_t);
    ssize_t n = real_pwrite64(fd, buffer, count, offset);
    if (n > 0) wrote(fd, offset, n);
    return n;
}

static void allocated(int fd, long long offset, long long length) {
    struct stat st;
    if (!regular(fd, &st)) return;
    emit("A\t%lu\t%lu\t%lld\t%lld", (unsigned long)st.st_dev, (unsigned long)st.st_ino, offset, length);
}

int posix_fallocate(int fd, off_t offset, off_t length) {
    REAL(posix_fallocate, int, int, off_t, off_t);
    int r = real_posix_fallocate(fd, offset, length);
    if (r == 0) allocated(fd, offset, length);
    return r;
}

int posix_fallocate64(int fd, off_t offset, off_t length) {
    REAL(posix_fallocate64, int, int, off_t, off_t);
    int r = real_posix_fallocate64(fd, offset, length);
    if (r == 0) allocated(fd, offset, length);
    return r;
}

int fallocate(int fd, int mode, off_t offset, off_t length) {
    REAL(fallocate, int, int, int, off_t, off_t);
    int r = real_fallocate(fd, mode, offset, length);
    if (r == 0 && mode == 0) allocated(fd, offset, length);
    return r;
}

int fallocate64(int fd, int mode, off_t offset, off_t length) {
    REAL(fallocate64, int, int, int, off_t, off_t);
    int r = real_fallocate64(fd, mode, offset, length);
    if (r == 0 && mode == 0) allocated(fd, offset, length);
    return r;
}

static void truncated(int fd, long long length) {
    struct stat st;
    if (!regular(fd, &st)) return;
    emit("T\t%lu\t%lu\t%lld", (unsigned long)st.st_dev, (unsigned long)st.st_ino, length);
}

int ftruncate(int fd, off_t length) {
    REAL(ftruncate, int, int, off_t);
    int r = real_ftruncate(fd, length);
    if (r == 0) truncated(fd, length);
    return r;
}

int ftruncate64(int fd, off_t length) {
    REAL(ftruncate64, int, int, off_t);
    int r = real_ftruncate64(fd, length);
    if (r == 0) truncated(fd, length);
    return r;
}

/* fsync and fdatasync alike: "B" before, "E" after a success. */
static int synced(int fd, int (*real)(int)) {
    struct stat st;
    char path[PATH_MAX] = {0};
    int is_dir = 0, is_file = 0;
    if (fd != log_fd && fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(link, path, sizeof path - 1);
            if (n > 0) {
                path[n] = '\0';
                is_dir = 1;
            }
        } else if (S_ISREG(st.st_mode)) {
            is_file = 1;
        }
    }
    if (is_file) {
        const char *failing = getenv("CROSSBOOK_SHIM_FAIL_SYNC");
        const char *when = getenv("CROSSBOOK_SHIM_FAIL_SYNC_WHEN");
        if (failing && when && access(when, F_OK) == 0) {
            char link[64], target[PATH_MAX] = {0};
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0 && strstr(target, failing)) {
                errno = EIO;
                return -1;
            }
        }
    }
    /* The thread that syncs names the sync: a process killed mid-sync
       leaves a start that no end may be matched with. */
    long tid = (long)syscall(SYS_gettid);
    if (is_dir) emit("DB\t%ld\t%s", tid, path);
    if (is_file) emit("B\t%lu\t%lu\t%ld", (unsigned long)st.st_dev, (unsigned long)st.st_ino, tid);
    int r = real(fd);
    if (r == 0 && is_dir) emit("DE\t%ld\t%s", tid, path);
    if (r == 0 && is_file) emit("E\t%lu\t%lu\t%ld", (unsigned long)st.st_dev, (unsigned long)st.st_ino, tid);
    return r;
}

int fsync(int fd) {
    REAL(fsync, int, int);
    return synced(fd, real_fsync);
}

int fdatasync(int fd) {
    REAL(fdatasync, int, int);
    return synced(fd, real_fdatasync);
}

int rename(const char *old, const char *new) {
    REAL(rename, int, const char *, const char *);
    char from[FULL_PATH], to[FULL_PATH];
    absolute(old, from);
    absolute(new, to);
    int r = real_rename(old, new);
    if (r == 0) emit("R\t%s\t%s", from, to);
    return r;
}

int unlink(const char *path) {
    REAL(unlink, int, const char *);
    char full[FULL_PATH];
    absolute(path, full);
    int r = real_unlink(path);
    if (r == 0) emit("U\t%s", full);
    return r;
}
