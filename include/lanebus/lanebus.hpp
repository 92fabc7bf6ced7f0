// lanebus — MIT License.
// Umbrella header: includes the public headers and nothing else.
#pragma once

#include "lanebus/bus.hpp"
#include "lanebus/client.hpp"
#include "lanebus/tenancy.hpp"
#include "lanebus/dlq.hpp"
#include "lanebus/durable.hpp"
#include "lanebus/fence.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/idempotency.hpp"
#include "lanebus/lease.hpp"
#include "lanebus/message.hpp"
#include "lanebus/metrics.hpp"
#include "lanebus/metrics_server.hpp"
#include "lanebus/options.hpp"
#include "lanebus/record.hpp"
#include "lanebus/schema.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"
#include "lanebus/transaction.hpp"
#include "lanebus/version.hpp"
