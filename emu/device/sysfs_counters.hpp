// A device's port counters as its sysfs files show them (sysfs.hpp,
// counter_files): the values the engine keeps, and keeping the files of a sysfs
// view current while the process runs.
//
// A view (`softverbs run`, or `softverbs sysfs DIR` with SYSFS_PATH=DIR) is
// written before the program starts, so its counter files begin at zero. The
// process that owns a device the view describes rewrites that device's counter
// files every kCounterRefreshMs from the progress thread, and only the files
// whose text changed; ibv_read_sysfs_file() on them is answered from the live
// counters at the call.
#pragma once

#include <string>
#include <vector>

#include "core/clock.hpp"
#include "emu/device/sysfs.hpp"

namespace softverbs::emu {

class Device;

// The device's counters now.
CounterValues counter_values(Device& dev);

// The text of the counter file `rel` below the device's ports/1 directory
// ("counters/port_xmit_data", "hw_counters/sent_pkts"); false if there is none.
bool counter_file_text(Device& dev, const std::string& rel, std::string* text);

// Finds the devices whose view is under ibv_get_sysfs_path()'s root (the
// view's node_guid is the device's and its hw_counters directory is writable)
// and starts rewriting their counter files on the scheduler. Call once.
void refresh_view_counters(const std::vector<Device*>& devices, Scheduler& scheduler);

}  // namespace softverbs::emu
