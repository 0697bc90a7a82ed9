// llama.cpp side of benchmarks/chat_vs_llamacpp.py: chat-template rendering and output parsing through
// libllama-common's common/chat.cpp, as llama-server uses them (--jinja, reasoning_format deepseek).
//
// JSON lines in, JSON lines out (one answer per line, errors reported per line):
//   {"cmd":"render","template":SRC,"bos":"<s>","eos":"</s>","messages":[...],"tools":[...]|null,
//    "add_generation_prompt":true,"chat_template_kwargs":{...},"enable_reasoning":-1}
//     -> {"prompt":..., "format":"peg-native", "generation_prompt":..., "supports_thinking":bool,
//         "thinking_start_tag":..., "thinking_end_tags":[...], "additional_stops":[...],
//         "preserved_tokens":[...], "enable_thinking":bool, "syntax":ID}
//   {"cmd":"parse","syntax":ID,"text":...,"is_partial":false,"reasoning_format":"deepseek"}
//     -> {"content":..., "reasoning_content":..., "tool_calls":[{"name","arguments","id"}]}
//
// The wall clock is pinned (time() and CLOCK_REALTIME, see FIXED_NOW) so that strftime_now and the
// date_string/datetime variables are reproducible; run with TZ=UTC.
//
//   g++ -O1 -std=c++17 -I$LC/common -I$LC/include -I$LC/ggml/include -I$LC/vendor chat_vs_llamacpp.cpp \
//       -L$BIN -lllama-common -lllama -Wl,-rpath,$BIN -o chat_vs_llamacpp

#include "chat.h"
#include "json.h"
#include "log.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

static const time_t FIXED_NOW = 1741953600;  // 2025-03-14 12:00:00 UTC (a Friday)

extern "C" time_t time(time_t * t) {
    if (t) {
        *t = FIXED_NOW;
    }
    return FIXED_NOW;
}

extern "C" int clock_gettime(clockid_t clk, struct timespec * ts) {
    if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE) {
        ts->tv_sec  = FIXED_NOW;
        ts->tv_nsec = 0;
        return 0;
    }
    return (int) syscall(SYS_clock_gettime, clk, ts);
}

struct syntax_entry {
    common_chat_parser_params params;
};

static std::map<std::string, common_chat_templates_ptr> g_templates;  // key: bos \x01 eos \x01 source
static std::vector<syntax_entry>                          g_syntaxes;

static common_chat_templates * get_templates(const std::string & src, const std::string & bos, const std::string & eos) {
    std::string key = bos + "\x01" + eos + "\x01" + src;
    auto        it  = g_templates.find(key);
    if (it != g_templates.end()) {
        return it->second.get();
    }
    auto t   = common_chat_templates_init(nullptr, src, bos, eos);
    auto ptr = t.get();
    g_templates[key] = std::move(t);
    return ptr;
}

static common_json str_array(const std::vector<std::string> & v) {
    common_json a = common_json::array();
    for (const auto & s : v) {
        a.push_back(s);
    }
    return a;
}

static common_json do_render(const common_json & req) {
    auto * tmpls = get_templates(req.at("template").get<std::string>(), req.value("bos", std::string("")),
                                 req.value("eos", std::string("")));
    common_json messages = req.at("messages");
    common_json tools    = req.contains("tools") ? req.at("tools") : common_json();

    // as tools/server/server-common.cpp oaicompat_chat_params_parse and server-context.cpp
    auto caps = common_chat_templates_get_caps(tmpls);
    common_chat_templates_inputs inputs;
    inputs.messages              = common_chat_msgs_parse_oaicompat(messages);
    inputs.tools                 = common_chat_tools_parse_oaicompat(tools);
    inputs.tool_choice           = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
    inputs.use_jinja             = true;
    inputs.parallel_tool_calls   = req.value("parallel_tool_calls", (bool) caps["supports_parallel_tool_calls"]);
    inputs.add_generation_prompt = req.value("add_generation_prompt", true);
    inputs.reasoning_format      = common_reasoning_format_from_name(req.value("reasoning_format", std::string("deepseek")));
    int  enable_reasoning        = req.value("enable_reasoning", -1);
    bool supports_thinking       = common_chat_templates_support_enable_thinking(tmpls);
    inputs.enable_thinking       = enable_reasoning != 0 && supports_thinking;
    if (req.contains("chat_template_kwargs") && req.at("chat_template_kwargs").is_object()) {
        for (const auto & item : req.at("chat_template_kwargs").items()) {
            inputs.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    auto it = inputs.chat_template_kwargs.find("enable_thinking");
    if (it != inputs.chat_template_kwargs.end()) {
        if (it->second == "true") {
            inputs.enable_thinking = true;
        } else if (it->second == "false") {
            inputs.enable_thinking = false;
        }
    }

    auto params = common_chat_templates_apply(tmpls, inputs);

    syntax_entry e;
    e.params = common_chat_parser_params(params);
    e.params.reasoning_format = inputs.reasoning_format;
    if (!params.parser.empty()) {
        e.params.parser.load(params.parser);
    }
    g_syntaxes.push_back(std::move(e));

    common_json out = common_json::object();
    out["prompt"]             = params.prompt;
    out["format"]             = std::string(common_chat_format_name(params.format));
    out["generation_prompt"]  = params.generation_prompt;
    out["supports_thinking"]  = params.supports_thinking;
    out["template_thinking"]  = supports_thinking;
    out["enable_thinking"]    = inputs.enable_thinking;
    out["thinking_start_tag"] = params.thinking_start_tag;
    out["thinking_end_tags"]  = str_array(params.thinking_end_tags);
    out["additional_stops"]   = str_array(params.additional_stops);
    out["preserved_tokens"]   = str_array(params.preserved_tokens);
    out["grammar_lazy"]       = params.grammar_lazy;
    out["has_grammar"]        = !params.grammar.empty();
    out["syntax"]             = (int) g_syntaxes.size() - 1;
    return out;
}

static common_json do_parse(const common_json & req) {
    int idx = req.at("syntax").get<int>();
    if (idx < 0 || idx >= (int) g_syntaxes.size()) {
        throw std::runtime_error("unknown syntax id");
    }
    common_chat_parser_params params = g_syntaxes[idx].params;
    if (req.contains("reasoning_format")) {
        params.reasoning_format = common_reasoning_format_from_name(req.at("reasoning_format").get<std::string>());
    }
    auto msg = common_chat_parse(req.at("text").get<std::string>(), req.value("is_partial", false), params);
    common_json out = common_json::object();
    out["content"]           = msg.content;
    out["reasoning_content"] = msg.reasoning_content;
    common_json calls        = common_json::array();
    for (const auto & tc : msg.tool_calls) {
        common_json c = common_json::object();
        c["name"]      = tc.name;
        c["arguments"] = tc.arguments;
        c["id"]        = tc.id;
        calls.push_back(c);
    }
    out["tool_calls"] = calls;
    return out;
}

int main() {
    common_log_set_verbosity_thold(-100);  // no log lines (they would go to stderr)
    std::ios::sync_with_stdio(false);
    std::string line;
    while (std::getline(std::cin, line)) {
        common_json out;
        try {
            common_json req = common_json::parse(line);
            std::string cmd = req.at("cmd").get<std::string>();
            if (cmd == "render") {
                out = do_render(req);
            } else if (cmd == "parse") {
                out = do_parse(req);
            } else if (cmd == "reset") {
                g_syntaxes.clear();
                g_templates.clear();
                out = common_json::object();
            } else {
                throw std::runtime_error("unknown cmd " + cmd);
            }
        } catch (const std::exception & e) {
            out          = common_json::object();
            out["error"] = std::string(e.what());
        } catch (...) {
            out          = common_json::object();
            out["error"] = std::string("unknown C++ exception");
        }
        std::cout << out.dump_safe() << "\n" << std::flush;
    }
    return 0;
}
