// lanebus — MIT License.
// `lanebus resume DIR TOPIC [GROUP]`: end a durable consumer group's outage
// pause (GroupOptions::outage, doc/retries.md "Outage pause") from outside the
// process that consumes it: the pause record is deleted and a resume request
// left in the store, which the live process obeys within about a second
// (Bus::resume in the process does the same at once).
#include <cstdio>
#include <memory>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "outage.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "resume",
    "DIR TOPIC [GROUP]",
    2,
    3,
    {},
    "Ends the outage pause of consumer group GROUP of the durable topic TOPIC in the store\n"
    "in DIR (for a durable queue GROUP is \"queue\", the default). A group pauses itself when\n"
    "transient failures across many keys show a dependency outage (GroupOptions::outage);\n"
    "while paused nothing is dead-lettered and one probe per backoff tests the dependency.\n"
    "The process consuming the group resumes within about a second (its maintenance pass\n"
    "reads the request); with no process running the group starts unpaused. `lanebus stats`\n"
    "shows paused groups. Exit status: 0 resumed, 1 not paused (no pause record) or the store\n"
    "cannot be written, 2 for a usage error.\n"};

}  // namespace

int cmd_resume(int argc, char** argv) {
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  const std::string& dir = args.operands[0];
  const std::string& topic = args.operands[1];
  const std::string group = args.operands.size() > 2 ? args.operands[2] : std::string("queue");
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto ro = detail::DurableStore::open(o);  // proves DIR is a store before anything is written
  if (!ro.ok()) {
    std::fprintf(stderr, "lanebus resume: cannot open %s as a lanebus store: %s\n", dir.c_str(),
                 ro.status().to_string().c_str());
    return 1;
  }
  (void)(*ro)->close();
  ro->reset();
  o.read_only = false;
  o.durability = Durability::Sync;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus resume: opening %s: %s\n", dir.c_str(), store.status().to_string().c_str());
    return 1;
  }
  Status s = detail::request_outage_resume(**store, topic, group);
  (void)(*store)->close();
  if (!s.ok()) {
    std::fprintf(stderr, "lanebus resume: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("resumed group \"%s\" of \"%s\" (a live consumer process resumes within about a second)\n",
              group.c_str(), topic.c_str());
  return 0;
}

}  // namespace lanebus::tool
