"""`yaml=PATH` as Hydra finds it: the config source of the `recipe://` scheme (conf/train.yaml's search path), a thin
class over train/config/recipe_yaml.py. That is imported when training composes, not by the plugin scan that every
Hydra app (data_prep among them) makes: the scan imports nothing of train."""
from typing import List, Optional

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigResult, ConfigSource


class RecipeConfigSource(ConfigSource):
    @staticmethod
    def scheme() -> str:
        return "recipe"

    def load_config(self, config_path: str) -> ConfigResult:
        from train.config import recipe_yaml

        return recipe_yaml.load_config(self, config_path)

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        from train.config import recipe_yaml

        return recipe_yaml.is_group(config_path)

    def is_config(self, config_path: str) -> bool:
        from train.config import recipe_yaml

        return recipe_yaml.is_config(config_path)

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        return []  # any file is an option: none to list
