/*
 * GPU and NUMA discovery for the launcher, without TensorFlow: importing it
 * to count GPUs would cost seconds on every launch and would initialise
 * CUDA in a process that never trains.
 *
 * Every path is looked up under a root directory ("" for the real system;
 * TNT_SYS_ROOT in the environment), so that tests can build a fake /dev and
 * /sys and cover hosts with GPUs and several NUMA nodes.
 */
#ifndef TNT_LAUNCHER_GPUS_H
#define TNT_LAUNCHER_GPUS_H

#include <sched.h>
#include <stddef.h>

/*
 * Parses a CUDA_VISIBLE_DEVICES value the way CUDA does: comma-separated
 * indices or UUIDs, the list ending at the first entry that is empty or a
 * negative number. Writes the valid entries, comma-separated, to list and
 * returns their number (0 for "" or "-1"), or -1 when list is too small.
 */
int tnt__gpus_parse_visible(const char *value, char *list, size_t len);

/*
 * The GPUs ranks on this host may use: none when root/dev has no nvidiaN
 * device; otherwise the devices CUDA_VISIBLE_DEVICES names when it is set
 * (cuda_visible not NULL), or all of them. Writes their CUDA names,
 * comma-separated, to list and returns their number, or -1 when list is
 * too small.
 */
int tnt__gpus_detect(const char *root, const char *cuda_visible, char *list, size_t len);

/* Counts the NUMA nodes under root/sys/devices/system/node (0 when that
 * directory does not exist). */
int tnt__numa_node_count(const char *root);

/* Parses a kernel CPU list such as "0-3,8,10-11". Returns 0, or -1 when
 * the text is malformed or names a CPU beyond what cpu_set_t holds. */
int tnt__cpulist_parse(const char *text, cpu_set_t *set);

/* Reads the CPUs of NUMA node `node` under root. Returns 0, or -1 when the
 * node does not exist or its list cannot be read. */
int tnt__numa_node_cpus(const char *root, int node, cpu_set_t *set);

#endif
