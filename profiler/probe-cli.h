/* The probe subcommand of aqua-profile. */
#pragma once

/* aqua-profile probe ARGS (argv[0] is "probe"); returns the exit status. */
int probe_main(int argc, char **argv);
