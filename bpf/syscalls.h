/* Record and map layouts of `meridian syscalls`: the one definition that both the
 * kernel program and the Python decoder (through BTF) read. */
#ifndef MERIDIAN_SYSCALLS_H
#define MERIDIAN_SYSCALLS_H

#define SYSCALLS_MAX_NR 512		/* syscall numbers covered by the sc_meta array */
#define SYSCALLS_COMM_LEN 16
#define SYSCALLS_STR_LEN 256		/* one user string argument (a path) */
#define SYSCALLS_PATH_LEN 256		/* an fd's path as /proc/PID/fd shows it (fdpath.bpf.h) */
#define SYSCALLS_PATH_DEPTH 32		/* dentries walked up from an fd's file (a power of 2) */
#define SYSCALLS_OUT_LEN 16		/* room for an output argument behind an end's header */
#define SYSCALLS_DATA_LEN 1024		/* room behind the header: str[0], str[1], fd_path (built
					 * with bounded writes: twice its length) */

enum syscalls_kind {
	SYSCALLS_START,		/* sys_enter: the arguments */
	SYSCALLS_END,		/* sys_exit: the result */
};

/* Per syscall number, set by user space: is it traced, which arguments are user
 * strings (-1: none), which one is an fd to resolve to a path. */
struct syscalls_meta {
	__u8 traced;
	__s8 str_pos[2];
	__s8 fd_pos;
	__u8 need_fd;		/* skip the call when that fd is < 0 (anonymous mmap) */
	__s8 out_pos;		/* an output argument (a user pointer) read at exit, -1: none */
	__u8 out_kind;		/* enum syscalls_out: what it points to */
	__u8 pad;
};

/* Output arguments read at a successful exit, sent behind the end's strings: the
 * bytes of at most two pieces of what the pointer points to (x86_64 layouts). */
enum syscalls_out {
	SYSCALLS_OUT_NONE,
	SYSCALLS_OUT_FDS,	/* int[2] (pipe, pipe2, socketpair): 8 bytes */
	SYSCALLS_OUT_STAT,	/* struct stat: st_mode (u32 at 24), st_size (s64 at 48) */
	SYSCALLS_OUT_STATX,	/* struct statx: stx_mode (u16 at 28), stx_size (u64 at 40) */
};

/* Everything the tool drops or cannot do, counted per CPU, never silently. */
struct syscalls_counters {
	__u64 events;		/* records submitted */
	__u64 lost;		/* records the ring buffer had no room for (index skipped) */
	__u64 str_retried;	/* user strings unreadable at entry, read again at exit */
	__u64 str_failed;	/* user strings unreadable at entry */
	__u64 retry_full;	/* retries not remembered: retry map full */
	__u64 forks_followed;	/* child processes added to the PID set */
	__u64 pids_full;	/* child processes not followed: PID set full */
	__u64 paths_cached;	/* fd paths taken from the cache, not walked */
};

/* One start or end event: this fixed header, then `str_len[0]` bytes of the first
 * string argument, `str_len[1]` of the second and `fd_len` of the fd's path, packed
 * (each NUL-terminated, a length of 0 when absent), then `out_len` bytes of an output
 * argument (an end only: enum syscalls_out, its pieces back to back, no NUL), so a
 * record is as long as what it carries (112 bytes without strings, not 872). An end
 * of a call with an output argument keeps SYSCALLS_OUT_LEN bytes for it, zeros past
 * out_len. Every event takes the next index, dropped ones too, so a gap in the indices
 * is a drop. */
struct syscalls_event {
	__u64 index;
	__u64 ts_ns;		/* CLOCK_MONOTONIC */
	__u32 pid;		/* thread group id */
	__u32 tid;
	__u32 nr;		/* syscall number */
	__u8 kind;		/* enum syscalls_kind */
	__u8 str_ok;		/* bit i: str i holds the string argument at meta str_pos[i] */
	__u8 fd_ok;		/* the fd's path follows */
	__u8 pad;
	__s64 ret;		/* end: the result */
	__u64 args[6];		/* start (and an end that re-read a string): raw arguments */
	char comm[SYSCALLS_COMM_LEN];
	__u16 str_len[2];	/* bytes of each string behind the header, NUL included */
	__u16 fd_len;		/* bytes of the fd's path behind the strings, NUL included */
	__u16 out_len;		/* bytes of the output argument behind the fd's path */
};

/* Where a record is built before it is copied to the ring at its real length. */
struct syscalls_buf {
	struct syscalls_event ev;
	char data[SYSCALLS_DATA_LEN];
};

#endif
