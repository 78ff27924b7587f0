DROP FUNCTION IF EXISTS pm_vector.pm_erased_raw_models(text);
