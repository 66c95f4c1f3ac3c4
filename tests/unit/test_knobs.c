/* test_knobs: the MOESERVE_* table (src/base/knobs.h): values from the environment, bad values
 * falling back to the default with a warning, overrides, and docs/USAGE.md listing exactly what
 * `moeserve help env` prints from the table. */
#include <stdlib.h>
#include <string.h>

#include "base/knobs.h"
#include "base/util.h"
#include "test.h"

TEST(knobs_documented_from_the_table)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s help env 2>/dev/null", test_bin());
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    char *doc = file_read_all("docs/USAGE.md", NULL);
    ASSERT(doc, "docs/USAGE.md (the tests run from the repository root)");
    const char *open = "<!-- knobs: the output of `moeserve help env` (a test holds them equal) -->\n";
    char *a = strstr(doc, open), *b = a ? strstr(a, "<!-- knobs end -->") : NULL;
    ASSERT(a && b, "docs/USAGE.md holds the knobs block");
    a += strlen(open);
    EXPECT((size_t)(b - a) == strlen(out) && !memcmp(a, out, strlen(out)),
           "docs/USAGE.md's list is `moeserve help env` (paste its output between the markers):\n%s", out);
    /* every knob is in the list */
    for (int k = 0; k < KNOB_COUNT; k++) EXPECT(strstr(out, knob_info(k)->var), "%s listed", knob_info(k)->var);
    free(doc);
    free(out);
}

TEST(knobs_from_the_environment)
{
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "MOESERVE_W4_ACT=bf16 MOESERVE_SHARED_SIDE=64 MOESERVE_INDEXER_SIDE=5000 "
             "MOESERVE_MLA_KERNEL=v9 MOESERVE_COMM_TIMEOUT=12x MOESERVE_TUNE_CACHE=/tmp/t.json %s help env --values 2>&1",
             test_bin());
    ASSERT(test_run(cmd, &out) == 0, "%s", out ? out : "");
    EXPECT(strstr(out, "MOESERVE_W4_ACT=bf16 (set)"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_SHARED_SIDE=64 (set)"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_TUNE_CACHE=/tmp/t.json (set)"), "%s", out);
    /* bad values: one warning each, naming the variable and what is allowed, and the default holds */
    EXPECT(strstr(out, "warning: MOESERVE_INDEXER_SIDE=5000: out of range [0, 1024]; using 16"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_INDEXER_SIDE=16 (default)"), "%s", out);
    EXPECT(strstr(out, "warning: MOESERVE_MLA_KERNEL=v9: not one of the choices (auto|grouped|per-head); using auto"), "%s", out);
    EXPECT(strstr(out, "warning: MOESERVE_COMM_TIMEOUT=12x: not an integer"), "%s", out);
    EXPECT(strstr(out, "MOESERVE_LOG=2 (default)"), "%s", out);
    free(out);
}

TEST(knobs_override_and_restore)
{
    long was = knob_get(KNOB_SHARED_SIDE);
    int set = knob_is_set(KNOB_SHARED_SIDE);
    knob_override(KNOB_SHARED_SIDE, 7);
    EXPECT_EQ_INT(knob_get(KNOB_SHARED_SIDE), 7);
    EXPECT_EQ_INT(knob_is_set(KNOB_SHARED_SIDE), 1);
    knob_override(KNOB_SHARED_SIDE, -1);
    EXPECT_EQ_INT(knob_get(KNOB_SHARED_SIDE), was);
    EXPECT_EQ_INT(knob_is_set(KNOB_SHARED_SIDE), set);
    /* a choice's value is its index in the list */
    knob_override(KNOB_W4_ACT, 1);
    EXPECT(!strcmp(knob_info(KNOB_W4_ACT)->choices, "split|bf16"));
    EXPECT_EQ_INT(knob_get(KNOB_W4_ACT), 1);
    knob_override(KNOB_W4_ACT, -1);
}
