/* CURVE keys and key files (curve.h): a public key given as text or as a file. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "curve.h"

static char dir[PATH_MAX];

static void setup(void)
{
        snprintf(dir, sizeof(dir), "/tmp/tc-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
        char cmd[PATH_MAX + 16];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
}

TestSuite(curve, .init = setup, .fini = teardown);

Test(curve, a_public_key_is_taken_as_text_or_from_a_file)
{
        char path[PATH_MAX + 8], pub[CURVE_KEY_TEXT + 1], got[CURVE_KEY_TEXT + 1], err[256];

        snprintf(path, sizeof(path), "%s/k", dir);
        cr_assert_eq(curve_keyfile_write(path, pub, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(curve_public_key_load(pub, got, err, sizeof(err)), 0, "%s", err);
        cr_assert_str_eq(got, pub);
        memset(got, 0, sizeof(got));
        cr_assert_eq(curve_public_key_load(path, got, err, sizeof(err)), 0, "%s", err);
        cr_assert_str_eq(got, pub);
}

/* "/tmp/tc-XXXXXX/" is 15 characters; the file name makes it 40, all of them Z85. */
Test(curve, a_file_whose_path_is_forty_z85_characters_is_read_not_taken_as_the_key)
{
        char path[2 * PATH_MAX], name[] = "server-key-file.pub.of-this-aquad.key";
        char pub[CURVE_KEY_TEXT + 1], got[CURVE_KEY_TEXT + 1], err[256];

        name[CURVE_KEY_TEXT - strlen(dir) - 1] = '\0';
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        cr_assert_eq(strlen(path), CURVE_KEY_TEXT);
        cr_assert(curve_key_valid(path), "%s is not Z85 after all", path);
        cr_assert_eq(curve_keyfile_write(path, pub, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(curve_public_key_load(path, got, err, sizeof(err)), 0, "%s", err);
        cr_assert_str_eq(got, pub);
}

Test(curve, neither_a_key_nor_a_file_is_an_error_naming_it)
{
        char got[CURVE_KEY_TEXT + 1], err[256] = "";

        cr_assert_lt(curve_public_key_load("/nonexistent/server.key.pub", got, err, sizeof(err)),
                     0);
        cr_assert(strstr(err, "/nonexistent/server.key.pub"), "%s", err);
}

/* A secret key others may read or write is refused as ssh refuses it, naming the mode. */
Test(curve, a_secret_key_file_others_may_read_or_write_is_refused)
{
        char path[PATH_MAX + 8], pub[CURVE_KEY_TEXT + 1], p[CURVE_KEY_TEXT + 1],
            s[CURVE_KEY_TEXT + 1], err[512];
        static const struct {
                mode_t mode;
                const char *says;
        } modes[] = {{0644, "readable by others (mode 0644)"},
                     {0640, "readable by others (mode 0640)"},
                     {0666, "writable by others (mode 0666)"}};

        snprintf(path, sizeof(path), "%s/k", dir);
        cr_assert_eq(curve_keyfile_write(path, pub, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(curve_keyfile_load(path, p, s, err, sizeof(err)), 0, "0600: %s", err);
        for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
                cr_assert_eq(chmod(path, modes[i].mode), 0);
                cr_assert_lt(curve_keyfile_load(path, p, s, err, sizeof(err)), 0);
                cr_assert(strstr(err, modes[i].says) && strstr(err, path), "%s", err);
        }
        /* Its public half alone (a .pub reading) is nobody's secret. */
        cr_assert_eq(curve_keyfile_load(path, p, NULL, err, sizeof(err)), 0, "%s", err);
}

/* A line that does not parse may be a pasted secret: the error names the file and line only. */
Test(curve, an_unparsable_line_is_never_echoed)
{
        char path[PATH_MAX + 8], p[CURVE_KEY_TEXT + 1], s[CURVE_KEY_TEXT + 1], err[512];
        FILE *f;

        snprintf(path, sizeof(path), "%s/k", dir);
        f = fopen(path, "w");
        cr_assert_not_null(f);
        fprintf(f, "JTKVSB%%%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni:{Lh6\n");
        fclose(f);
        cr_assert_eq(chmod(path, 0600), 0);
        cr_assert_lt(curve_keyfile_load(path, p, s, err, sizeof(err)), 0);
        cr_assert(strstr(err, ":1:"), "%s", err);
        cr_assert_null(strstr(err, "JTKV"), "the line's text was printed: %s", err);
}
