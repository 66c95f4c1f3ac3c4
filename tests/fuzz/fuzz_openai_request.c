/* fuzz_openai_request: an HTTP request body through openai_start, the parser and validator of
 * POST /v1/completions and /v1/chat/completions (a body that names "messages" goes to the chat
 * route), without a network: the built-in model's tokenizer and chat template, and an engine
 * that is never started, so an accepted request only waits in its queue and is cancelled at once.
 * Refused: an ApiError whose OpenAI error object (openai_error) is valid JSON with a message and
 * a 4xx/5xx status. Accepted: an engine id, and a streaming chat's role chunk. MOESERVE_FUZZ_MODEL
 * names another model directory (default models/builtin-nvfp4, from the repository root). */
#include "fuzz.h"

#include <jansson.h>

#include "backend/backend.h"
#include "base/util.h"
#include "engine/engine.h"
#include "format/model_text.h"
#include "model/model.h"
#include "server/metrics.h"
#include "server/openai.h"

static Model M;
static Backend BE;
static ModelText MT;
static Engine *E;
static Metrics METRICS;
static Api A;
static ApiReq R;

static void on_event(void *user, uint64_t id)
{
    (void)user, (void)id;
}

static void setup(void)
{
    log_level = LOG_ERROR;
    const char *dir = getenv("MOESERVE_FUZZ_MODEL");
    if (!dir || !*dir) dir = "models/builtin-nvfp4";
    model_load(&M, dir);
    model_text_open(&MT, dir, M.cfg.eos_ids, M.cfg.n_eos);
    backend_cpu_init(&BE, 1);
    EngineOptions eo;
    engine_options_default(&eo);
    eo.n_blocks = 160; /* max_model_len 2048 in blocks of 16, and room */
    eo.max_model_len = 2048;
    E = engine_create(&M, &BE, &eo, MT.eos_ids, MT.n_eos);
    metrics_init(&METRICS);
    A = (Api){.engine = E, .text = &MT, .model_name = "builtin", .model_alias = "builtin-nvfp4", .max_model_len = eo.max_model_len,
              .vocab = M.cfg.vocab, .created = 1764892800, .metrics = &METRICS};
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!E) setup();
    openai_req_reset(&R);
    R.route = memmem(data, size, "\"messages\"", 10) ? ROUTE_CHAT : ROUTE_COMPLETIONS;
    ApiErr err;
    memset(&err, 0, sizeof err);
    /* the body as http.c hands it over: its bytes, not NUL-terminated */
    char *body = malloc(size ? size : 1);
    memcpy(body, data, size);
    int rc = openai_start(&A, &R, body, size, on_event, NULL, &err);
    free(body);
    if (rc == API_OK) {
        FUZZ_CHECK(R.id != 0, "accepted without an engine id");
        if (R.stream && R.chat) FUZZ_CHECK(R.out.len > 0 && strstr(R.out.p, "\"role\":\"assistant\""), "no role chunk");
        openai_cancel(&A, &R);
        return 0;
    }
    FUZZ_CHECK(rc < 0, "openai_start returned %d", rc);
    FUZZ_CHECK(fuzz_msg_ok(err.msg, sizeof err.msg), "error %d without a message", rc);
    ApiBuf out = {0};
    int status = openai_error(rc, &err, &out);
    FUZZ_CHECK(status >= 400 && status < 600, "status %d", status);
    json_error_t je;
    json_t *o = json_loadb(out.p, out.len, 0, &je);
    FUZZ_CHECK(o && json_is_string(json_object_get(json_object_get(o, "error"), "message")), "error body: %s: %.300s", je.text,
               out.p ? out.p : "");
    json_decref(o);
    openai_buf_free(&out);
    return 0;
}
