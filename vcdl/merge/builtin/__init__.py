"""The built-in merge rules, a module each: the rule, its form text and the settings it owns.

:mod:`.vc_asgd`, :mod:`.delta`, :mod:`.average`, :mod:`.easgd`,
:mod:`.diloco`, :mod:`.diloco_async`. :mod:`vcdl.merge.rules` registers them by name; the
interface they implement is :mod:`vcdl.merge.interface`. A new rule is a
module here, its line in :data:`vcdl.merge.rules.RULES`, and, if it owns
``merge`` keys, its :class:`~vcdl.merge.interface.RuleSettings` among
:class:`~vcdl.merge.settings.MergeSection`'s bases.
"""
