/* lanebus — MIT License.
 * The C API (lanebus/lanebus.h) in one page: a durable queue in a scratch
 * store, a consumer whose handler asks for one retry and rejects a bad
 * message, the dead-letter queue read and replayed, the counters as JSON. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lanebus/lanebus.h"

static atomic_int handled;
static atomic_int fixed; /* the consumer's bug is fixed: accept "bad" payloads too */

static lanebus_outcome handle(lanebus_message* m, void* user) {
  (void)user;
  printf("   handler: \"%.*s\" attempt %u\n", (int)m->payload_len, (const char*)m->payload, m->attempt);
  if (m->payload_len >= 5 && memcmp(m->payload, "flaky", 5) == 0 && m->attempt == 1) {
    m->reason = "downstream busy";
    return LANEBUS_RETRY;
  }
  if (!atomic_load(&fixed) && m->payload_len >= 3 && memcmp(m->payload, "bad", 3) == 0) {
    m->reason = "cannot parse";
    return LANEBUS_REJECT;
  }
  atomic_fetch_add(&handled, 1);
  return LANEBUS_ACK;
}

static int wait_for(int want) {
  struct timespec ms = {0, 1000000L};
  for (int i = 0; i < 10000 && atomic_load(&handled) < want; ++i) nanosleep(&ms, NULL);
  return atomic_load(&handled) >= want;
}

#define TRY(call)                                                                      \
  do {                                                                                 \
    if ((call) != LANEBUS_OK) {                                                        \
      fprintf(stderr, "%s failed: %s\n", #call, err.message);                          \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

int main(void) {
  lanebus_error err;
  char dir[] = "/tmp/lanebus-c-consumer-XXXXXX";
  if (mkdtemp(dir) == NULL) return 1;
  char store[64];
  snprintf(store, sizeof store, "%s/store", dir);
  printf("lanebus %s from C\n", lanebus_version());

  lanebus_bus* bus = NULL;
  TRY(lanebus_open("c-consumer", store, 2, &bus, &err));
  lanebus_topic* jobs = NULL;
  TRY(lanebus_create_queue(bus, "c.jobs", 2, LANEBUS_DURABLE, &jobs, &err));
  lanebus_subscription* sub = NULL;
  TRY(lanebus_consume(bus, jobs, handle, NULL, 3, &sub, &err));

  printf("1. publish three jobs to the durable queue \"c.jobs\"\n");
  const char* payloads[] = {"ok-1", "flaky-2", "bad-3"};
  for (int i = 0; i < 3; ++i) TRY(lanebus_publish(jobs, "job", 3, payloads[i], strlen(payloads[i]), &err));
  if (!wait_for(2)) return 1;

  printf("2. the rejected job waits in the dead-letter queue\n");
  lanebus_dlq_list* list = NULL;
  for (int i = 0; i < 10000; ++i) {
    TRY(lanebus_dlq_list_entries(bus, "c.jobs", 1, &list, &err));
    if (lanebus_dlq_list_size(list) > 0) break;
    lanebus_dlq_list_free(list);
    list = NULL;
    struct timespec ms = {0, 1000000L};
    nanosleep(&ms, NULL);
  }
  if (lanebus_dlq_list_size(list) != 1) return 1;
  const lanebus_dlq_entry* e = lanebus_dlq_list_at(list, 0);
  uint64_t id = e->id;
  printf("   entry %llu: \"%.*s\" %s, reason \"%s\"\n", (unsigned long long)id, (int)e->payload_len,
         (const char*)e->payload, e->error_class, e->reason);
  lanebus_dlq_list_free(list);

  printf("3. the consumer is fixed; replay the entry\n");
  atomic_store(&fixed, 1);
  uint64_t replayed = 0;
  TRY(lanebus_dlq_replay(bus, &id, 1, "example", &replayed, &err));
  if (!wait_for(3)) return 1;

  char* json = NULL;
  TRY(lanebus_stats_json(bus, &json, &err));
  printf("4. stats JSON: %zu bytes, starts %.40s...\n", strlen(json), json);
  lanebus_string_free(json);

  printf("5. a bad call returns a code and a message: ");
  lanebus_code rc = lanebus_publish(jobs, NULL, 0, "", 0, &err);
  printf("%s: %s\n", lanebus_code_name(rc), err.message);

  TRY(lanebus_unsubscribe(sub, &err));
  TRY(lanebus_close(bus, &err));
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) return 1;
  printf("done: %d jobs handled\n", atomic_load(&handled));
  return rc == LANEBUS_INVALID_ARGUMENT ? 0 : 1;
}
