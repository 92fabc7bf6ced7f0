// lanebus — MIT License.
// LANEBUS_API marks the exported surface of liblanebus; everything else is hidden.
#pragma once

#if defined(LANEBUS_STATIC_BUILD) || !defined(__GNUC__)
#define LANEBUS_API
#else
#define LANEBUS_API [[gnu::visibility("default")]]
#endif
