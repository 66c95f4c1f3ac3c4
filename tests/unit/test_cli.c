/* test_cli: the command lines of `moeserve` as a vLLM or SGLang user writes them: every spelling
 * of an option reaches the same field, `--name=value`, the model as the first argument, one line
 * naming the closest option for a misspelt one, help from the tables (defaults shown, test hooks
 * hidden, every option named in docs/USAGE.md), --version, --quantization checked against the
 * checkpoint, other engines' no-op options accepted with a log line; and over HTTP, several
 * --served-model-name names and serve's --seed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "engine/engine.h"
#include "model/model_opts.h"
#include "server/http.h"
#include "server_harness.h"
#include "test.h"

/* ---- serve's option groups, parsed in process ---- */

static ModelOpts MO;
static DeviceOpts DEV;
static EngineOptions EO;
static HttpOptions HO;
static ApiOptions AO;

static void serve_parse(const char *line)
{
    static char buf[1024];
    static char *argv[64];
    snprintf(buf, sizeof buf, "serve %s", line);
    int argc = 0;
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ",
    &save)) argv[argc++] = t;
    memset(&MO, 0, sizeof MO);
    memset(&DEV, 0, sizeof DEV);
    engine_options_default(&EO);
    http_options_default(&HO);
    api_options_default(&AO);
    const OptGroup groups[] = {model_opt_group(&MO, MODEL_OPT_ALL), par_opt_group(&MO.par), device_opt_group(&DEV),
                               engine_opt_group(&EO), http_opt_group(&HO), api_opt_group(&AO)};
    const OptCommand cmd = {.cmd = "serve", .synopsis = "MODEL [options]", .groups = groups, .n_groups = 6,
    .max_pos = 1,
                            .pos_name = "MODEL"};
    const char *pos = NULL;
    int n = 0;
    opt_parse(&cmd, argc, argv, &pos, &n);
}

TEST(cli_vllm_sglang_spellings)
{
    /* each spelling, with a space and with '=', sets the same field to 3 */
    static const struct {
        const char *names[5];
        int *field;
    } ints[] = {
        {{"--tp", "--tensor-parallel-size", "-tp", "--tp-size"}, &MO.par.tp},
        {{"--pp", "--pipeline-parallel-size", "-pp", "--pp-size"}, &MO.par.pp},
        {{"--ep", "--expert-parallel-size", "-ep", "--ep-size"}, &MO.par.ep},
        {{"--max-running-requests", "--max-num-seqs"}, &EO.max_running},
        {{"--max-batch-tokens", "--max-num-batched-tokens", "--max-prefill-tokens"}, &EO.max_batch_tokens},
        {{"--max-model-len", "--context-length"}, &EO.max_model_len},
        {{"--num-kv-blocks", "--num-gpu-blocks-override"}, &EO.n_blocks},
        {{"--chunked-prefill-size"}, &EO.chunked_prefill},
        {{"--port"}, &HO.port},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        for (int j = 0; j < 5 && ints[k].names[j]; j++)
            for (int eq = 0; eq < 2; eq++) {
                char line[128];
                snprintf(line, sizeof line, eq && ints[k].names[j][1] == '-' ? "m %s=3" : "m %s 3", ints[k].names[j]);
                serve_parse(line);
                EXPECT(*ints[k].field == 3, "%s: %d", line, *ints[k].field);
            }
    const char *fractions[] = {"--gpu-memory-utilization 0.5", "--mem-fraction-static=0.5"};
    EngineOptions def;
    engine_options_default(&def);
    for (int k = 0; k < 2; k++) { /* the GPU's share; --kv-fraction itself keeps its default */
        serve_parse(fractions[k]);
        EXPECT(EO.gpu_fraction == 0.5 && EO.kv_fraction == def.kv_fraction, "%s: %g %g", fractions[k], EO.gpu_fraction,
               EO.kv_fraction);
    }
    const char *no_prefix[] = {"--no-prefix-caching", "--disable-radix-cache", "--no-enable-prefix-caching",
                               "--enable-prefix-caching=false"};
    for (int k = 0; k < 4; k++) {
        serve_parse(no_prefix[k]);
        EXPECT_EQ_INT(EO.prefix_caching, 0);
    }
    serve_parse("--disable-radix-cache --enable-prefix-caching");
    EXPECT_EQ_INT(EO.prefix_caching, 1);
    const char *eager[] = {"--disable-cuda-graph", "--enforce-eager", "--no-graphs"};
    for (int k = 0; k < 3; k++) {
        serve_parse(eager[k]);
        EXPECT_EQ_INT(EO.no_graphs, 1);
    }
    serve_parse("--model-path=/m --kv-cache-dtype=fp8_e4m3 --host 0.0.0.0 --served-model-name a b c --seed=5 "
                "--tool-call-parser glm47 --reasoning-parser=glm45 --load-format dummy -q modelopt_fp4 "
                "--enable-expert-parallel "
                "--tp 4 --dp 1");
    EXPECT(MO.dir && !strcmp(MO.dir, "/m"));
    EXPECT_EQ_INT(MO.kv_dtype, KV_DTYPE_FP8);
    EXPECT(!strcmp(HO.host, "0.0.0.0"));
    EXPECT(AO.names.n == 3 && !strcmp(AO.names.v[0], "a") && !strcmp(AO.names.v[2], "c"));
    EXPECT(AO.seed == 5);
    EXPECT(AO.tool_parser && !strcmp(AO.tool_parser, "glm47"));
    EXPECT(AO.reasoning_parser && !strcmp(AO.reasoning_parser, "glm45"));
    EXPECT_EQ_INT(MO.dummy, 1);
    EXPECT(MO.quantization && !strcmp(MO.quantization, "modelopt_fp4"));
    char err[256];
    EXPECT(par_resolve(&MO.par, err, sizeof err) == 0 && MO.par.ep == 4 && MO.par.tp == 4, "%s", err);
    /* attention data parallel: SGLang counts groups within --tp, vLLM's --data-parallel-size multiplies it */
    const struct { const char *args; int tp, dp, ep; } dps[] = {
        {"m --tp 4 --dp 2", 4, 2, 4},
        {"m --tp-size 8 --dp-size 8 --enable-dp-attention", 8, 8, 8},
        {"m --tp 4 --enable-dp-attention", 4, 4, 4},
        {"m --tensor-parallel-size 2 --data-parallel-size 4 --enable-expert-parallel", 8, 4, 8},
        {"m --data-parallel-size 2", 2, 2, 2},
        {"m --tp 2 --dp 2 --ep 2 --pp 2", 2, 2, 2},
    };
    for (size_t k = 0; k < sizeof dps / sizeof dps[0]; k++) {
        serve_parse(dps[k].args);
        int rc = par_resolve(&MO.par, err, sizeof err);
        EXPECT(rc == 0 && MO.par.tp == dps[k].tp && MO.par.dp == dps[k].dp && MO.par.ep == dps[k].ep,
               "%s: rc %d, tp %d dp %d ep %d (%s)", dps[k].args, rc, MO.par.tp, MO.par.dp, MO.par.ep, rc ? err : "");
        EXPECT(par_resolve(&MO.par, err, sizeof err) == 0 && MO.par.tp == dps[k].tp, "%s: twice", dps[k].args);
    }
    const struct { const char *args, *want; } bad[] = {
        {"m --tp 4 --dp 3", "--dp must divide --tp"},
        {"m --dp 2", "--dp must divide --tp"},
        {"m --tp 4 --dp 2 --ep 2", "--ep must equal --tp"},
        {"m --dp 2 --data-parallel-size 4", "give one of them"},
        {"m --tp 2 --dp 2 --pp 2 --pp-microbatches 2", "one micro-batch"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        serve_parse(bad[k].args);
        err[0] = 0;
        EXPECT(par_resolve(&MO.par, err, sizeof err) < 0 && strstr(err, bad[k].want), "%s: '%s'", bad[k].args, err);
    }
}

/* ---- the binary ---- */

static int run(const char *args, char **out)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' %s", test_bin(), args);
    return test_run(cmd, out);
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

TEST(cli_flag_equals_value_and_positional_model)
{
    const char *dir = test_data("configs/glm4.5");
    char a[4400], *o1, *o2, *o3;
    snprintf(a, sizeof a, "info --model '%s' --json --tp 2 --max-num-seqs 8 --kv-cache-dtype fp8", dir);
    ASSERT(run(a, &o1) == 0, "%s", o1);
    snprintf(a, sizeof a,
    "info --model='%s' --json --tensor-parallel-size=2 --max-running-requests=8 --kv-cache-dtype=fp8", dir);
    EXPECT_EQ_INT(run(a, &o2), 0);
    snprintf(a, sizeof a, "info '%s' --json -tp 2 --max-num-seqs=8 --kv-cache-dtype fp8", dir);
    EXPECT_EQ_INT(run(a, &o3), 0);
    EXPECT(strstr(o1, "\"tp\":2") && strstr(o1, "\"max_running\":8"), "%s", o1);
    EXPECT(!strcmp(o1, o2), "--name=value differs:\n%s\n%s", o1, o2);
    EXPECT(!strcmp(o1, o3), "the positional model differs:\n%s\n%s", o1, o3);
    free(o1);
    free(o2);
    free(o3);
    /* the model twice, or none */
    snprintf(a, sizeof a, "info '%s' --model '%s'", dir, dir);
    EXPECT_EQ_INT(run(a, &o1), 2);
    EXPECT(strstr(o1, "the model is given twice"), "%s", o1);
    free(o1);
    EXPECT_EQ_INT(run("serve --port 0", &o1), 2);
    EXPECT(strstr(o1, "error: serve: a model is required") && lines(o1) == 1, "%s", o1);
    free(o1);
}

TEST(cli_misspelt_option_one_line)
{
    const struct { const char *args, *want; } cases[] = {
        {"serve m --max-num-seq 4", "error: serve: unknown option '--max-num-seq'; did you mean --max-num-seqs?\n"},
        {"serve m --tensor-paralel-size 2", "error: serve: unknown option '--tensor-paralel-size'; did you mean "
                                            "--tensor-parallel-size"},
        {"generate m --temprature 0", "error: generate: unknown option '--temprature'; did you mean --temperature?\n"},
        {"bench serve --num-promts 3",
         "error: bench serve: unknown option '--num-promts'; did you mean --num-prompts?\n"},
        {"info m --gpu-memory 80", "error: info: unknown option '--gpu-memory'; did you mean --gpu-mem?\n"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *out;
        EXPECT_EQ_INT(run(cases[k].args, &out), 2);
        EXPECT(!strncmp(out, cases[k].want, strlen(cases[k].want)), "%s: %s", cases[k].args, out);
        /* one line, never the option list */
        EXPECT(lines(out) == 1 && strlen(out) < 300, "%s: %s", cases[k].args, out);
        free(out);
    }
    char *out;
    EXPECT_EQ_INT(run("serve m --tool-call-parser hermes", &out), 2);
    EXPECT(strstr(out, "option --tool-call-parser: 'hermes': moeserve parses GLM tool calls"), "%s", out);
    free(out);
    EXPECT_EQ_INT(run("serve m --dp 3 --tp 4", &out), 1);
    EXPECT(strstr(out, "error: --dp 3 with --tp 4: the 4 tensor ranks of a stage form the attention groups, so --dp "
                       "must divide --tp") && lines(out) == 1, "%s", out);
    free(out);
}

/* the first spelling of each option line of a help text, and every "also" and no-op spelling */
static int help_names(const char *help, char names[][64], int max)
{
    int n = 0;
    for (const char *l = help; *l && n < max; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        size_t len = strcspn(l, "\n");
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < 1023 ? len : 1023), l);
        const char *p = NULL;
        if (!strncmp(line, "  -", 3)) {
            sscanf(line + 2, "%63s", names[n]);
            n++;
            p = strstr(line, "(also ");
            if (p) p += 6;
        } else if (strstr(line, "with no effect here:")) {
            p = strstr(line, ":") + 1;
        }
        for (char *save = NULL, *t = p ? strtok_r((char *)p, " ,)", &save) : NULL; t && n < max;
             t = strtok_r(NULL, " ,)", &save))
            if (t[0] == '-') snprintf(names[n++], 64, "%s", t);
    }
    return n;
}

static const char *const commands[] = {"serve", "generate", "logits", "perplexity", "info", "quantize", "synth", "tune",
                                       "tokenize", "detokenize", "download", "calibrate", "diagnose", "plan", "bench model",
                                       "bench kernels", "bench serve", "bench plot"};

TEST(cli_help_from_the_tables)
{
    char *out;
    ASSERT(run("serve --help", &out) == 0);
    const char *want[] = {"usage: moeserve serve MODEL [options]", "--port N", "(default: 8000)",
    "--max-running-requests N",
                          "(also --max-num-seqs) (default: 64)", "--tp N",
                          "(also --tensor-parallel-size, -tp, --tp-size)",
                          "--gpu-memory-utilization F", "--served-model-name NAME...",
                          "--kv-cache-dtype auto|float32|bf16|fp8",
                          "with no effect here: --trust-remote-code"};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) EXPECT(strstr(out, want[k]), "no '%s' in:\n%s", want[k],
    out);
    EXPECT(!strstr(out, "--inject-") && !strstr(out, "--script-output"), "test hooks shown:\n%s", out);
    free(out);
    /* every command's help; every option it names is in docs/USAGE.md */
    size_t ulen;
    char path[4200];
    snprintf(path, sizeof path, "%s/docs/USAGE.md", test_root());
    char *usage = file_read_all(path, &ulen);
    ASSERT(usage, "%s", path);
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        char a[128];
        snprintf(a, sizeof a, "%s -h", commands[c]);
        EXPECT_EQ_INT(run(a, &out), 0);
        EXPECT(!strncmp(out, "usage: moeserve ", 16), "%s: %s", commands[c], out);
        EXPECT(!strstr(out, "--inject-"), "%s shows a test hook", commands[c]);
        static char names[256][64];
        int n = help_names(out, names, 256);
        EXPECT(n > 0, "%s: no options in its help", commands[c]);
        for (int i = 0; i < n; i++) {
            char quoted[80];
            snprintf(quoted, sizeof quoted, "`%.64s", names[i]);
            const char *at = usage;
            int found = 0;
            while (!found && (at = strstr(at, quoted))) {
                char next = at[strlen(quoted)];
                found = !(next == '-' || (next >= 'a' && next <= 'z'));
                at++;
            }
            EXPECT(found, "docs/USAGE.md does not name %s (of %s)", names[i], commands[c]);
        }
        free(out);
    }
    free(usage);
}

TEST(cli_version)
{
    char *out, *git = NULL;
    EXPECT_EQ_INT(run("--version", &out), 0);
    EXPECT(!strncmp(out, "moeserve ", 9) && strstr(out, "\ngit commit: ") && strstr(out, "\nCUDA: "), "%s", out);
    /* built in a git checkout: the commit it names is one of this checkout's (HEAD may have moved
     * on since the build) */
    char cmd[4400], commit[64] = "";
    const char *at = strstr(out, "\ngit commit: ");
    if (at) sscanf(at + 13, "%40[0-9a-f]", commit);
    snprintf(cmd, sizeof cmd, "git -C '%s' rev-parse --git-dir >/dev/null 2>&1", test_root());
    if (test_run(cmd, &git) == 0) {
        EXPECT(strlen(commit) >= 7, "no commit id: %s", out);
        free(git);
        git = NULL;
        snprintf(cmd, sizeof cmd, "git -C '%s' cat-file -e '%s^{commit}' 2>&1", test_root(), commit);
        EXPECT(test_run(cmd, &git) == 0, "commit '%s' is not in this checkout: %s", commit, out);
    }
    free(git);
    char *again;
    EXPECT_EQ_INT(run("version", &again), 0);
    EXPECT(!strcmp(out, again), "%s / %s", out, again);
    free(again);
    free(out);
}

/* make install PREFIX=DIR puts this build's moeserve in DIR/bin, and it runs from there. */
TEST(cli_make_install)
{
    char bin[4096], cmd[12800], *out = NULL;
    snprintf(bin, sizeof bin, "%s", test_bin());
    char *slash = strrchr(bin, '/');
    ASSERT(slash && slash > bin);
    *slash = 0; /* the build directory */
    const char *root = test_root();
    size_t nr = strlen(root);
    /* BUILD as the Makefile names it: relative to the checkout when the binary is inside it */
    const char *build = !strncmp(bin, root, nr) && bin[nr] == '/' ? bin + nr + 1 : bin;
    snprintf(cmd, sizeof cmd, "make -s -C '%s' -o '%s/moeserve' install BUILD='%s' PREFIX='%s/prefix' 2>&1", root, build,
             build, test_tmpdir());
    EXPECT(test_run(cmd, &out) == 0, "%s: %s", cmd, out ? out : "");
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "'%s/prefix/bin/moeserve' --version", test_tmpdir());
    EXPECT(test_run(cmd, &out) == 0 && out && !strncmp(out, "moeserve ", 9), "%s: %s", cmd, out ? out : "");
    free(out);
}

TEST(cli_quantization_checked_and_noop_options)
{
    char a[9000], out_file[4300], *out;
    snprintf(out_file, sizeof out_file, "%s/cli-logits.f32", test_tmpdir());
    /* the NVFP4 built-in model under another format: refused with the reason, before any work */
    snprintf(a, sizeof a, "logits '%s/models/builtin-nvfp4' --quantization fp8 --tokens 1,2 --out '%s' --device cpu",
             test_root(), out_file);
    EXPECT_EQ_INT(run(a, &out), 1);
    EXPECT(strstr(out, "error: --quantization fp8: the checkpoint is NVFP4") && strstr(out, "give modelopt_fp4"), "%s",
    out);
    free(out);
    snprintf(a, sizeof a, "logits '%s/models/builtin' -q fp8 --tokens 1,2 --out '%s' --device cpu", test_root(),
    out_file);
    EXPECT_EQ_INT(run(a, &out), 1);
    EXPECT(strstr(out, "the checkpoint is not quantized, and moeserve does not quantize at load time"), "%s", out);
    free(out);
    snprintf(a, sizeof a, "logits '%s/models/builtin' --quantization awq --tokens 1,2 --out '%s' --device cpu",
    test_root(),
             out_file);
    EXPECT_EQ_INT(run(a, &out), 1);
    EXPECT(strstr(out, "--quantization awq: moeserve runs ModelOpt NVFP4"), "%s", out);
    free(out);
    /* the checkpoint's own format, and options that mean nothing here: accepted, one log line each */
    snprintf(a, sizeof a,
    "logits '%s/models/builtin-nvfp4' --quantization=modelopt_fp4 --trust-remote-code --dtype auto "
             "--tokens=1,2 --out='%s' --device=cpu", test_root(), out_file);
    EXPECT_EQ_INT(run(a, &out), 0);
    EXPECT(strstr(out, "option --trust-remote-code: moeserve runs its own code") && strstr(out,
    "option --dtype auto: "),
           "%s", out);
    free(out);
    struct stat st;
    EXPECT(stat(out_file, &st) == 0 && st.st_size > 0 && st.st_size % (2 * sizeof(float)) == 0);
}

/* ---- over HTTP ---- */

static char *completion(int port, const char *model, const char *seed)
{
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"The package\",\"max_tokens\":12,\"temperature\":1.0,"
             "\"top_p\":1,\"top_k\":0,\"ignore_eos\":true%s%s}", model, seed ? ",\"seed\":" : "", seed ? seed : "");
    Resp r;
    if (post(port, "/v1/completions", body, &r) || r.status != 200) {
        resp_free(&r);
        return NULL;
    }
    json_t *j = body_json(&r);
    const char *t = json_string_value(jget(j, "choices.0.text"));
    const char *m = json_string_value(jget(j, "model"));
    char *s = t && m && !strcmp(m, "alpha") ? xstrdup(t) : NULL; /* responses carry the first name */
    json_decref(j);
    resp_free(&r);
    return s;
}

TEST(server_cli_served_names_and_seed)
{
    Srv s;
    ASSERT(srv_start(&s, "cli",
    "--served-model-name alpha beta gamma --seed 7 --trust-remote-code --disable-log-requests "
                                "--enable-auto-tool-choice --gpu-memory-utilization 0.5 --max-num-seqs 4") == 0);
    Resp r;
    ASSERT(http(s.port, "GET", "/v1/models", NULL, NULL, &r) == 0 && r.status == 200);
    json_t *j = body_json(&r);
    EXPECT(json_array_size(jget(j, "data")) == 3, "%s", r.body);
    const char *ids[] = {"alpha", "beta", "gamma"};
    for (int i = 0; i < 3; i++) {
        char p[32];
        snprintf(p, sizeof p, "data.%d.id", i);
        EXPECT(json_string_value(jget(j, p)) && !strcmp(json_string_value(jget(j, p)), ids[i]), "%s", r.body);
    }
    json_decref(j);
    resp_free(&r);
    ASSERT(http(s.port, "GET", "/v1/models/gamma", NULL, NULL, &r) == 0);
    EXPECT(r.status == 200 && strstr(r.body, "\"id\":\"gamma\""), "%d %s", r.status, r.body);
    resp_free(&r);
    /* every name is accepted in a request; another is a 404 */
    char *a = completion(s.port, "beta", NULL), *b = completion(s.port, "gamma", NULL), *c = completion(s.port,
    "alpha", "7");
    EXPECT(a && b && c, "a request under a served name failed");
    /* --seed 7 is the seed of the requests without one: the same text as seed 7 given */
    EXPECT(a && b && c && !strcmp(a, b) && !strcmp(a, c), "'%s' '%s' '%s'", a ? a : "", b ? b : "", c ? c : "");
    /* and sampling is random at all: other seeds give other texts */
    int differ = 0;
    for (int k = 1; k <= 4 && a; k++) {
        char seed[16];
        snprintf(seed, sizeof seed, "%d", 100 + k);
        char *t = completion(s.port, "alpha", seed);
        differ |= t && strcmp(t, a) != 0;
        free(t);
    }
    EXPECT(differ, "four other seeds all gave '%s'", a ? a : "");
    free(a);
    free(b);
    free(c);
    EXPECT(post(s.port, "/v1/completions", "{\"model\":\"delta\",\"prompt\":\"x\",\"max_tokens\":1}", &r) == 0 &&
           r.status == 404 && strstr(r.body, "model_not_found"), "%d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    EXPECT_EQ_INT(srv_stop(&s, 60), 0);
    /* the options with no effect here, and the GPU's memory fraction on the CPU: one log line each */
    size_t n;
    char *log = file_read_all(s.log, &n);
    ASSERT(log);
    EXPECT(strstr(log, "option --trust-remote-code: ") && strstr(log, "option --disable-log-requests: ") &&
           strstr(log, "option --enable-auto-tool-choice: "), "%s", log);
    EXPECT(strstr(log, "--gpu-memory-utilization 0.5 does not apply on the cpu backend"), "%s", log);
    free(log);
}
