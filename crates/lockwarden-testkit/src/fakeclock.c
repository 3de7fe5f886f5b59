/* A wall clock offset for redis-server, preloaded (LD_PRELOAD) by the testkit's
 * FakeClock: CLOCK_REALTIME (clock_gettime, gettimeofday, time) reads the real time plus
 * the whole seconds written in the file $LOCKWARDEN_CLOCK_FILE, read on every call so a
 * test can step the clock while the server runs. Every other clock (the monotonic one
 * Redis's timers use) is left alone.
 *
 * Why not libfaketime (Debian's `faketime`): Debian's redis-server links jemalloc, whose
 * start-up reads the clock from inside libfaketime's own initialisation, which then
 * aborts ("Unexpected recursive calls to clock_gettime()"), and the server never starts.
 * This shim needs no initialisation: it calls the kernel directly (no dlsym, which may
 * allocate) and never allocates. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long offset_seconds(void) {
    const char *path = getenv("LOCKWARDEN_CLOCK_FILE");
    if (!path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    long sign = 1, value = 0;
    const char *p = buf;
    if (*p == '-' || *p == '+') sign = (*p++ == '-') ? -1 : 1;
    while (*p >= '0' && *p <= '9') value = value * 10 + (*p++ - '0');
    return sign * value;
}

static int realtime(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && realtime(id)) ts->tv_sec += offset_seconds();
    return (int)r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    long r = syscall(SYS_gettimeofday, tv, tz);
    if (r == 0) tv->tv_sec += offset_seconds();
    return (int)r;
}

time_t time(time_t *t) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
