/* fuzz_chat_template: a Jinja chat template through chat_template_parse; an accepted template is
 * rendered against a fixed conversation (system, user, an assistant turn with reasoning and a
 * tool call, the tool's answer, a user turn in content parts), with tools and chat_template_kwargs
 * and the generation prompt, then without them. A render gives text or a message; the renderer's
 * own step and memory limits bound a hostile loop. */
#include "fuzz.h"

#include "format/chat_template.h"

static json_t *messages, *tools, *kwargs;

static void setup(void)
{
    json_error_t je;
    messages = json_loads(
        "[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
        "{\"role\":\"user\",\"content\":\"Hi <b>&amp; \\\"q\\\" \\u00e9\\u65e5 {{ x }} {% if %}\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"think first\",\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":2,\"x\":[1,null,true]}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"temp\\\": 20}\"},"
        "{\"role\":\"assistant\",\"content\":\"It is 20.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and tomorrow?\"}]}]",
        0, &je);
    tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The weather\","
                       "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                       "\"days\":{\"type\":\"integer\",\"minimum\":1}},\"required\":[\"city\"]}}}]",
                       0, &je);
    kwargs = json_loads("{\"enable_thinking\":false,\"n\":3,\"s\":\"str\",\"l\":[1,2.5,\"a\"],\"d\":{\"k\":null}}", 0, &je);
    if (!messages || !tools || !kwargs) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!messages) setup();
    char *text = fuzz_cstr(data, size);
    char err[1024];
    err[0] = 0;
    ChatTemplate *t = chat_template_parse(text, err, sizeof err);
    free(text);
    if (!t) {
        FUZZ_CHECK(fuzz_msg_ok(err, sizeof err), "refused without a message");
        return 0;
    }
    for (int k = 0; k < 2; k++) {
        char *out = NULL;
        err[0] = 0;
        int rc = chat_template_render(t, messages, k ? NULL : tools, !k, k ? NULL : kwargs, "<s>", "</s>", &out, err, sizeof err);
        if (rc == 0) FUZZ_CHECK(out != NULL, "rendered without output");
        else FUZZ_CHECK(fuzz_msg_ok(err, sizeof err) && !out, "render failed without a message");
        free(out);
    }
    chat_template_free(t);
    return 0;
}
