#include "jobs/job_schedule.h"

#include <algorithm>
#include <map>

namespace tprun::jobs {

std::vector<Unit> make_units(const std::vector<const JobRequest*>& todo, int64_t batch_size,
                             const std::function<std::optional<std::string>(const JobRequest&)>& batch_key) {
  std::vector<const JobRequest*> order = todo;
  std::sort(order.begin(), order.end(), [](const JobRequest* a, const JobRequest* b) { return a->id < b->id; });
  std::vector<Unit> units;
  std::map<std::string, size_t> open;  // key -> index of its unfilled batch
  for (const JobRequest* r : order) {
    const std::optional<std::string> key = batch_size > 1 ? batch_key(*r) : std::nullopt;
    if (!key) {
      units.push_back({r});
      continue;
    }
    auto it = open.find(*key);
    if (it == open.end() || static_cast<int64_t>(units[it->second].size()) >= batch_size) {
      open[*key] = units.size();
      units.push_back({r});
    } else {
      units[it->second].push_back(r);
    }
  }
  return units;
}

std::vector<std::vector<Unit>> assign_units(std::vector<Unit> units, int replicas,
                                            const std::function<double(const JobRequest&)>& cost) {
  auto unit_cost = [&](const Unit& u) {
    double c = 0;
    for (const JobRequest* r : u) c += cost(*r);
    return c;
  };
  std::vector<double> costs;
  std::vector<size_t> order(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    order[i] = i;
    costs.push_back(unit_cost(units[i]));
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (costs[a] != costs[b]) return costs[a] > costs[b];
    return units[a].front()->id < units[b].front()->id;
  });
  std::vector<double> load(static_cast<size_t>(replicas), 0.0);
  std::vector<std::vector<Unit>> out(static_cast<size_t>(replicas));
  for (size_t i : order) {
    const size_t best = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[best] += costs[i];
    out[best].push_back(std::move(units[i]));
  }
  return out;
}

}  // namespace tprun::jobs
