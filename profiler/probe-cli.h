/* The probe and merge subcommands of aqua-profile. */
#pragma once

/* aqua-profile probe ARGS (argv[0] is "probe"); returns the exit status. */
int probe_main(int argc, char **argv);
/* aqua-profile merge ARGS (argv[0] is "merge"); returns the exit status. */
int merge_main(int argc, char **argv);
