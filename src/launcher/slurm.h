/*
 * The variables of a Slurm allocation, which tell the launcher the nodes
 * it may run on when it runs inside one (in an `salloc` shell or an
 * `sbatch` script) and no hostfile is given:
 *
 *   SLURM_JOB_NODELIST   (older name SLURM_NODELIST) the nodes, as a
 *                        compressed host list: "node[01-03,07],gpu5"
 *   SLURM_TASKS_PER_NODE the tasks of each node, in the same order,
 *                        compressed: "2(x3),1" is 2, 2, 2, 1
 *   SLURM_NTASKS_PER_NODE what --ntasks-per-node asked for, when given
 *
 * The parsers are pure functions over a string, so that the unit tests
 * can call them on any input.
 */
#ifndef TNT_LAUNCHER_SLURM_H
#define TNT_LAUNCHER_SLURM_H

#include <stddef.h>

#include "hostfile.h"

/* The most hosts a host list may expand to. */
#define TNT__SLURM_MAX_HOSTS 100000

/*
 * Expands a compressed host list into out, in Slurm's order: items are
 * separated by commas; each is a name with any number of bracket groups,
 * and a group holds numbers and ranges ("[01-03,07]"), zero-padded to the
 * width of the range's first number. Every name must be a valid host name
 * and appear once. out->lines holds each name's position (from 1).
 * Returns 0, or -1 with a one-line message in err (out is then empty).
 * Release out with tnt__hostlist_free either way.
 */
int tnt__slurm_hostlist_parse(const char *text, tnt__hostlist_t *out, char *err, size_t err_len);

/*
 * Parses a compressed list of task counts ("2(x3),1"): every count and
 * repetition a whole number from 1. Sets *nodes to the nodes it describes
 * and *min, *max to the fewest and the most tasks of a node. Returns 0, or
 * -1 with a one-line message in err.
 */
int tnt__slurm_tasks_parse(const char *text, int *nodes, int *min, int *max, char *err,
                           size_t err_len);

#endif
